//! efa-emu: a software EFA (AWS Elastic Fabric Adapter) PCI function.
//!
//! The device model ([`device`]) sees the world through [`transport`];
//! [`vfio`] serves it to QEMU over vfio-user; [`shmem`] is the memory a BAR
//! can share with the guest so that its stores (doorbells, LLQ) arrive
//! without a message. [`health`] counts what went wrong, rate-limits the
//! warnings and ends the process with a summary line. [`copycount`] counts
//! the payload bytes the data path copies (for the benchmark).
//! [`control_socket`] offers the device's control window to the host.

pub mod control_socket;
pub mod copycount;
pub mod device;
pub mod health;
pub mod shmem;
pub mod transport;
pub mod vfio;

#[cfg(test)]
mod as_user;
