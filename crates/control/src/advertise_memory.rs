//! `headroom.io/be-memory` (bytes): the memory BE can be given on this node without taking the
//! LC's. Each tick's room is the node's memory less what the LC and the system hold (MemTotal −
//! MemAvailable, BE's own charge added back; the LC groups' `memory.current`, their page cache
//! included, never counted as room); the [`Engine`] keeps the least room of each bucket, and the
//! target is the least over the horizon (percentile 0: the LC's and system's peak) less a margin,
//! capped by `safety.be_memory_limit_bytes`. Memory is not compressible, so a latency violation
//! does not change it (be-cpu falls for that, and a batch pod needs both); unread memory figures
//! make it 0 (or the floor), untrusted.

use headroom_types::observation::Observation;

use super::{AdvertiseParams, Advertised, Change, Engine, LcHealth, MemoryInput, Resource, Sample};

/// The tick's be-memory input: the room BE had, from the observation's memory figures, and the
/// floor (bytes requested by the node's bound pods).
pub fn memory_input(obs: &Observation, floor_bytes: u64) -> MemoryInput {
    let (Some(total), Some(available)) = (obs.mem_total_bytes, obs.mem_available_bytes) else {
        return MemoryInput {
            room_bytes: 0,
            total_bytes: obs.mem_total_bytes.unwrap_or(0),
            lc_bytes: obs.lc_memory_bytes,
            health: LcHealth::Untrusted {
                reason: "MemTotal or MemAvailable not read (/proc/meminfo)".into(),
            },
            floor_bytes,
        };
    };
    // An unread BE charge counts as 0: the room is then smaller, never larger.
    let be = obs.be_memory_bytes.unwrap_or(0);
    let others = total
        .saturating_sub(available)
        .saturating_sub(be)
        .max(obs.lc_memory_bytes.unwrap_or(0));
    MemoryInput {
        room_bytes: total.saturating_sub(others),
        total_bytes: total,
        lc_bytes: obs.lc_memory_bytes,
        health: LcHealth::Held,
        floor_bytes,
    }
}

/// The be-memory advertiser: an [`Engine`] of bytes.
#[derive(Debug, Clone)]
pub struct MemoryAdvertiser(Engine);

impl MemoryAdvertiser {
    pub fn new(params: AdvertiseParams) -> MemoryAdvertiser {
        MemoryAdvertiser(Engine::new(Resource::BeMemory, params))
    }

    pub fn params(&self) -> &AdvertiseParams {
        self.0.params()
    }

    /// The value now (`None` before the first tick).
    pub fn value(&self) -> Option<u64> {
        self.0.value()
    }

    /// Takes one tick's input; the advertisement now, and the change this tick made (if any).
    pub fn update(&mut self, t_ms: u64, input: &MemoryInput) -> (Advertised, Option<Change>) {
        self.0.update(&Sample {
            t_ms,
            value: input.room_bytes,
            health: &input.health,
            floor: input.floor_bytes,
        })
    }
}

#[cfg(test)]
#[path = "advertise_memory_tests.rs"]
mod tests;
