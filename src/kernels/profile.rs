//! Wall-clock time per fused op and phase, for `cgnmt bench --profile-ops`: off unless switched on, then one
//! relaxed atomic load per op call when off and one clock read + one lock when on.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);
static TOTALS: Mutex<BTreeMap<&'static str, (f64, u64)>> = Mutex::new(BTreeMap::new());

/// Switch the per-op timers on or off (process-wide); switching clears nothing.
pub fn set_enabled(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Forget every total so far.
pub fn reset() {
    TOTALS.lock().expect("profile totals").clear();
}

/// Seconds and calls per name since the last reset, sorted by name.
pub fn totals() -> Vec<(&'static str, f64, u64)> {
    TOTALS
        .lock()
        .expect("profile totals")
        .iter()
        .map(|(k, (s, n))| (*k, *s, *n))
        .collect()
}

/// Run `f`, adding its wall time to `name`'s total when profiling is on.
pub fn timed<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
    if !ON.load(Ordering::Relaxed) {
        return f();
    }
    let t = Instant::now();
    let r = f();
    let s = t.elapsed().as_secs_f64();
    let mut m = TOTALS.lock().expect("profile totals");
    let e = m.entry(name).or_insert((0.0, 0));
    e.0 += s;
    e.1 += 1;
    r
}

/// Adds the time from its creation to its drop to `name`'s total (when profiling is on at creation).
pub struct Scope {
    name: &'static str,
    start: Option<Instant>,
}

impl Scope {
    pub fn new(name: &'static str) -> Self {
        Scope {
            name,
            start: ON.load(Ordering::Relaxed).then(Instant::now),
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some(t) = self.start {
            let s = t.elapsed().as_secs_f64();
            let mut m = TOTALS.lock().expect("profile totals");
            let e = m.entry(self.name).or_insert((0.0, 0));
            e.0 += s;
            e.1 += 1;
        }
    }
}
