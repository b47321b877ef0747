//! Where a tool's wall time went on the machine's cores: how many cores the
//! whole machine kept busy over its run (its process, the Postgres backends
//! it read from, anything else) and how many its own process used. Two
//! tools at the same wall time can differ in both: one that keeps fewer
//! cores busy waits somewhere; one whose own process uses more cores does
//! more work per row.

/// Clock ticks the machine spent busy and in all, from `/proc/stat`'s
/// first line (every core summed).
fn machine_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is in user).
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some((total.checked_sub(idle)?, total))
}

/// A process's command name and its CPU ticks (user and system, with
/// those of its children it has waited for), from a `/proc/PID/stat` file.
fn process_ticks(path: &std::path::Path) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    // The command name may hold spaces; the fields after it are plain.
    let name = text.get(text.find('(')? + 1..text.rfind(')')?)?.to_string();
    let rest = text.get(text.rfind(')')? + 2..)?;
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|v| v.parse().ok())
        .collect();
    // utime, stime, cutime, cstime: fields 14-17 of the whole line.
    Some((name, f.iter().sum()))
}

/// This process's CPU ticks.
fn own_ticks() -> Option<u64> {
    process_ticks(std::path::Path::new("/proc/self/stat")).map(|(_, t)| t)
}

/// The CPU ticks of every process named `postgres` on the machine: the
/// server's backends, and through the postmaster's count of its waited-for
/// children, those that ended since.
fn postgres_ticks() -> Option<u64> {
    let mut sum = 0;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        match process_ticks(&e.path().join("stat")) {
            Some((name, t)) if name == "postgres" => sum += t,
            _ => {}
        }
    }
    Some(sum)
}

/// The cores `/proc/stat`'s first line sums (its `cpuN` lines): every
/// online one, whatever this process's affinity or cgroup allows.
fn cores() -> f64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let n = text
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    n.max(1) as f64
}

/// A reading taken before a tool runs.
pub(crate) struct Mark {
    machine: Option<(u64, u64)>,
    own: Option<u64>,
    postgres: Option<u64>,
}

/// The cores the machine kept busy on average, and the cores this process
/// used, over a run of `seconds`.
#[derive(Clone, Copy, Default)]
pub(crate) struct Busy {
    pub(crate) machine: Option<f64>,
    pub(crate) own: Option<f64>,
    /// The cores the Postgres server used (the source's backends, and the
    /// control plane's for orca).
    pub(crate) postgres: Option<f64>,
}

impl Mark {
    pub(crate) fn now() -> Mark {
        Mark {
            machine: machine_ticks(),
            own: own_ticks(),
            postgres: postgres_ticks(),
        }
    }

    /// What was used since the mark, over `seconds` of wall time.
    pub(crate) fn busy(&self, seconds: f64) -> Busy {
        // Ticks are 1/100 s on Linux (USER_HZ).
        let machine = match (self.machine, machine_ticks()) {
            // A hypervisor's steal count can step back: no figure then.
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 && b1 >= b0 => {
                Some((b1 - b0) as f64 / (t1 - t0) as f64 * cores())
            }
            _ => None,
        };
        let per_second = |before: Option<u64>, after: Option<u64>| match (before, after) {
            (Some(a), Some(b)) if seconds > 0.0 && b >= a => Some((b - a) as f64 / 100.0 / seconds),
            _ => None,
        };
        Busy {
            machine,
            own: per_second(self.own, own_ticks()),
            postgres: per_second(self.postgres, postgres_ticks()),
        }
    }
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.2}"));
        write!(
            f,
            "cores busy {} of {} (its own process {}, Postgres {})",
            show(self.machine),
            cores(),
            show(self.own),
            show(self.postgres)
        )
    }
}
