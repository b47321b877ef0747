//! How a runner and an engine talk: the control channel the runner asks
//! an attempt's status over and stops it by ([`control`]), and the data
//! edge ([`edge`], the engine's end; [`pump`], the runner's) over which the
//! runner sends what it reads from a source it hosts, in [`frame`]s.

pub mod control;
pub mod edge;
pub mod frame;
pub mod peer;
pub mod pump;
pub mod wire;
