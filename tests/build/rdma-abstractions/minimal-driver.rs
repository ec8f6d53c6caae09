// The smallest driver builds, with its table: AHs, MRs, QPs and completion
// counters are optional (`driver::NotOffered`).
pub(crate) use crate::driver::allocate;
