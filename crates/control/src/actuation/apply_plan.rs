//! Carrying out one plan: each change in phase order, retried, and on a failure BE kept no
//! wider than the smaller of the two allocations (confining writes go on, giving ones are undone).

use super::*;

impl Actuation {
    /// Carries out the plan that brings the node from what it holds to `target`.
    pub fn apply_target(
        &mut self,
        node: &mut dyn Node,
        target: &BTreeMap<Knob, KnobValue>,
        verify: bool,
    ) -> Result<ApplyReport, ActuationError> {
        let mut report = ApplyReport::default();
        // First sight of a knob (a block device named for the first time): its original.
        for k in target.keys() {
            if let std::collections::btree_map::Entry::Vacant(slot) = self.original.entry(k.clone())
            {
                let v = node.read(k).map_err(|e| read_error(node, k, e))?;
                slot.insert(v);
            }
        }
        let mut before: BTreeMap<Knob, KnobValue> = BTreeMap::new();
        for key in target.keys() {
            let believed = self.current.get(key).cloned();
            let actual = match (&believed, verify || self.unknown.contains(key)) {
                (Some(v), false) => v.clone(),
                _ => node.read(key).map_err(|e| read_error(node, key, e))?,
            };
            if let Some(b) = believed.filter(|b| *b != actual) {
                tracing::warn!(knob = %node.describe(key), expected = %b, found = %actual,
                    "drift: changed by someone else; repairing");
                report.drift.push(Write {
                    knob: key.clone(),
                    from: Some(b),
                    to: actual.clone(),
                });
            }
            before.insert(key.clone(), actual);
        }
        let mut changes: Vec<(Knob, KnobValue, KnobValue)> = target
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(*v) || self.unknown.contains(*k))
            .map(|(k, v)| (k.clone(), before[k].clone(), v.clone()))
            .collect();
        self.sort(&mut changes);

        let mut done: Vec<(Knob, KnobValue, KnobValue)> = Vec::new();
        let mut failed: Option<(Knob, KnobValue, KnobValue, u32, NodeError)> = None;
        let mut also_failed = Vec::new();
        let mut failed_keys: Vec<Knob> = Vec::new();
        for (key, from, to) in changes {
            // After a failure only what confines BE goes on: the node must never keep BE
            // wider than the plan's target because an unrelated knob refused a value.
            if failed.is_some() && !self.confines_be(&key, &from, &to) {
                continue;
            }
            match self.write_with_retry(node, &key, &from, &to, &mut report.retries) {
                Ok(()) => {
                    self.unknown.remove(&key);
                    report.writes.push(Write {
                        knob: key.clone(),
                        from: Some(from.clone()),
                        to: to.clone(),
                    });
                    done.push((key, from, to));
                }
                Err((attempts, source)) if failed.is_none() => {
                    failed = Some((key, from, to, attempts, source));
                }
                Err((_, source)) => {
                    also_failed.push(format!("{} to {to}: {source}", node.describe(&key)));
                    // One that may be half-made (several files) is read back next time.
                    if half_made(&key, &from, &to) {
                        self.unknown.insert(key.clone());
                    }
                    failed_keys.push(key);
                }
            }
        }
        // A write that confines BE failed (a narrower cpuset the kernel refuses because a
        // group below BE's holds more CPUs, a lower quota below a sub-group's): BE would keep
        // what the write was to take, the LC's CPUs included. It is frozen instead until the
        // write goes through (the next plans keep it frozen: a thaw is never made after a
        // failure). Fourth hostile pass.
        if let Some((key, from, to, _, _)) = &failed {
            let confinement_failed = (self.confines_be(key, from, to) && freezing_confines(key))
                || failed_keys.iter().any(freezing_confines);
            if confinement_failed {
                failed_keys.push(key.clone());
                self.freeze_instead(
                    node,
                    target,
                    &before,
                    &failed_keys,
                    &mut done,
                    &mut report,
                    &mut also_failed,
                );
            }
        }
        // Said once the plan's writes are done: naming a file and writing a log line between
        // BE's shrink and the next write delayed the reaction.
        for w in &report.writes {
            if let Some(from) = &w.from {
                tracing::info!(knob = %node.describe(&w.knob), from = %from, to = %w.to, "write");
            }
        }
        if let Some((key, from, to, attempts, source)) = failed {
            let (kept, undo): (Vec<_>, Vec<_>) = done
                .into_iter()
                .partition(|(k, from, to)| self.confines_be(k, from, to));
            let rollback = self.roll_back(node, &key, &from, &to, &undo);
            // What the node holds now: the confining writes kept, the values before this plan
            // where the rollback worked; knobs whose undo failed are unknown and read back.
            for (k, v) in before {
                if !self.unknown.contains(&k) {
                    self.current.insert(k, v);
                }
            }
            for (k, _, v) in &kept {
                self.current.insert(k.clone(), v.clone());
            }
            let failure = WriteFailure {
                what: node.describe(&key),
                knob: key,
                value: to,
                attempts,
                source,
                rollback,
                kept: kept
                    .into_iter()
                    .map(|(knob, from, to)| Write {
                        knob,
                        from: Some(from),
                        to,
                    })
                    .collect(),
                also_failed,
            };
            tracing::error!(error = %failure, "write failed");
            return Err(ActuationError::Write(Box::new(failure)));
        }
        // A cgroup knob left out of this target (an idle group's weight) may be changed by the
        // kernel meanwhile: forget it, so the next target holding it reads it back first.
        self.current
            .retain(|k, _| target.contains_key(k) || !matches!(k, Knob::Cgroup { .. }));
        for (k, v) in target {
            self.current.insert(k.clone(), v.clone());
        }
        Ok(report)
    }

    /// Freezes every BE group the plan left thawed (see `apply_target`): the last resort
    /// when a write that was to confine BE failed. Made writes join `done` (kept, confining).
    #[allow(clippy::too_many_arguments)]
    fn freeze_instead(
        &mut self,
        node: &mut dyn Node,
        target: &BTreeMap<Knob, KnobValue>,
        before: &BTreeMap<Knob, KnobValue>,
        failed: &[Knob],
        done: &mut Vec<(Knob, KnobValue, KnobValue)>,
        report: &mut ApplyReport,
        also_failed: &mut Vec<String>,
    ) {
        let frozen = KnobValue::Frozen(true);
        for g in self.groups.be.clone() {
            let key = Knob::cgroup(&g, CgroupKnob::Frozen);
            if !target.contains_key(&key) || failed.contains(&key) {
                continue;
            }
            let now = done
                .iter()
                .rev()
                .find(|(k, _, _)| *k == key)
                .map(|(_, _, to)| to)
                .or_else(|| before.get(&key));
            let Some(from) = now.cloned().filter(|v| *v != frozen) else {
                continue;
            };
            match self.write_with_retry(node, &key, &from, &frozen, &mut report.retries) {
                Ok(()) => {
                    tracing::warn!(group = %g, "a write confining BE failed: BE frozen until it goes through");
                    self.unknown.remove(&key);
                    report.writes.push(Write {
                        knob: key.clone(),
                        from: Some(from.clone()),
                        to: frozen.clone(),
                    });
                    done.push((key, from, frozen.clone()));
                }
                Err((_, e)) => {
                    also_failed.push(format!("{} to {frozen}: {e}", node.describe(&key)))
                }
            }
        }
    }

    /// Orders a plan: by phase, then the LC's side before BE's within a phase, then by knob.
    pub(super) fn sort(&self, changes: &mut [(Knob, KnobValue, KnobValue)]) {
        changes.sort_by_cached_key(|(k, from, to)| {
            let lc = self.lc_side(k);
            (knob::phase(lc, from, to), !lc, k.clone())
        });
    }

    /// Whether a change takes from BE (and only from BE): the freeze, `cpu.idle` set, and any
    /// narrowing of a knob that is not the LC's. These are kept when a plan fails.
    fn confines_be(&self, k: &Knob, from: &KnobValue, to: &KnobValue) -> bool {
        !self.lc_side(k)
            && matches!(
                knob::phase(false, from, to),
                Phase::Freeze | Phase::Shrink | Phase::SetIdle
            )
    }

    /// The LC's own knobs: its cgroup's, and the default resctrl group's mask.
    fn lc_side(&self, k: &Knob) -> bool {
        match k {
            Knob::Cgroup { group, .. } => {
                self.lc_groups.contains(group) && !self.groups.be.contains(group)
            }
            Knob::Schemata { group } => group.is_empty(),
            _ => false,
        }
    }

    pub(super) fn write_with_retry(
        &mut self,
        node: &mut dyn Node,
        key: &Knob,
        from: &KnobValue,
        to: &KnobValue,
        retries: &mut u32,
    ) -> Result<(), (u32, NodeError)> {
        let mut attempt = 1;
        loop {
            match node.write(key, from, to) {
                Ok(()) => return Ok(()),
                Err(e) if attempt >= WRITE_ATTEMPTS => return Err((attempt, e)),
                Err(e) => {
                    tracing::warn!(knob = %node.describe(key), value = %to, error = %e, attempt,
                        "write failed; retrying");
                    *retries += 1;
                    self.retries += 1;
                    attempt += 1;
                    node.retry_pause();
                }
            }
        }
    }

    /// Undoes `done` newest first, and the failed write itself where it can be half-made (two
    /// schemata lines, four v1 throttle files, a partly built HTB tree).
    fn roll_back(
        &mut self,
        node: &mut dyn Node,
        failed: &Knob,
        failed_from: &KnobValue,
        failed_to: &KnobValue,
        done: &[(Knob, KnobValue, KnobValue)],
    ) -> RollbackOutcome {
        let mut errors = Vec::new();
        let mut ignored = 0;
        if half_made(failed, failed_from, failed_to) {
            if let Err((_, e)) =
                self.write_with_retry(node, failed, failed_to, failed_from, &mut ignored)
            {
                errors.push(format!(
                    "{} back to {failed_from}: {e}",
                    node.describe(failed)
                ));
                self.unknown.insert(failed.clone());
            }
        }
        for (k, from, to) in done.iter().rev() {
            match self.write_with_retry(node, k, to, from, &mut ignored) {
                Ok(()) => tracing::info!(knob = %node.describe(k), to = %from, "rolled back"),
                Err((_, e)) => {
                    errors.push(format!("{} back to {from}: {e}", node.describe(k)));
                    self.unknown.insert(k.clone());
                    self.current.remove(k);
                }
            }
        }
        if !errors.is_empty() {
            RollbackOutcome::Incomplete(errors)
        } else if done.is_empty() {
            RollbackOutcome::NothingToUndo
        } else {
            RollbackOutcome::RolledBack(done.len())
        }
    }
}

/// Whether freezing BE does what a failed write to `knob` was to do (hold BE's use of CPUs,
/// cache, bandwidth, disk or network down): not for a memory limit (a frozen group keeps its
/// memory), nor for the freeze itself.
fn freezing_confines(knob: &Knob) -> bool {
    !matches!(
        knob,
        Knob::Cgroup {
            knob: CgroupKnob::MemoryMax | CgroupKnob::Frozen,
            ..
        }
    )
}

/// Whether a failed write may have been partly made: two schemata lines, four v1 throttle
/// files, a partly built HTB tree.
fn half_made(knob: &Knob, from: &KnobValue, to: &KnobValue) -> bool {
    match (knob, to) {
        (Knob::Schemata { .. }, KnobValue::Schemata(v)) => !v.l3.is_empty() && !v.mb.is_empty(),
        (Knob::Io { .. }, _) => true,
        (Knob::Egress, _) => matches!(from, KnobValue::Htb(None)),
        _ => false,
    }
}
