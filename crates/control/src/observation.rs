//! What the sensors saw in one tick (the contract lives in `headroom-types`).

pub use headroom_types::observation::*;
