// Mmap entries belong to the object they were inserted for, which the core
// destroys before its context: a driver holds cookies, never an entry it
// could keep past the context.
use crate::rdma::mmap::{
    Mappings,
    MmapSet, //
};

pub(crate) fn keep(set: MmapSet<'_, ()>) -> Mappings {
    set.into_mappings()
}
