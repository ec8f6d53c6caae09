// The smallest driver builds, with its table: AHs, MRs, QPs and completion
// counters are optional (`NotOffered`).
pub(crate) use crate::driver::allocate;
