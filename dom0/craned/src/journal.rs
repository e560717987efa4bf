//! The migration journal: one entry per guest with a migration under way on
//! this host, in dom0's own XenStore tree (`crane_xs::layout::migration_key`),
//! written before each step, so a craned that restarts knows where every
//! migration stood and can resume or roll it back. XenStore writes of one key
//! are atomic, so an entry is always whole. The value uses crane-xs's
//! `key=value` format.

use std::time::{SystemTime, UNIX_EPOCH};

use crane_libxl::PciAddr;
use crane_xs::layout::{DOM0_MIGRATIONS, migration_key};
use crane_xs::store::XsData;
use crane_xs::value::{Fields, ValueError};
use crane_xs::{XenStore, XsError};
use craned_control::Mode;

/// Longest journal value.
const MAX_LEN: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Source: prepare-migrate posted (or about to be).
    Preparing,
    /// Source: the agent answered ready-for-detach; detaching the GPU.
    Detaching,
    /// Source: GPU detached and back in the pool; xl migrate/save may run.
    Detached,
    /// Source: giving the GPU back after a failure.
    RollingBack,
    /// Destination: the domain arrived; waiting for its agent.
    Receiving,
    /// Destination: no GPU free; the guest waits on the proxy (or parked).
    WaitingGpu,
    /// Destination: no GPU free; the guest's processes run on its CPU
    /// (`no_free_gpu = "cpu"`) until one frees.
    OnCpu,
    /// Destination: attaching the chosen GPU.
    Attaching,
    /// Destination (or a rollback): prepare-resume posted.
    Resuming,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Preparing => "preparing",
            Phase::Detaching => "detaching",
            Phase::Detached => "detached",
            Phase::RollingBack => "rolling-back",
            Phase::Receiving => "receiving",
            Phase::WaitingGpu => "waiting-gpu",
            Phase::OnCpu => "on-cpu",
            Phase::Attaching => "attaching",
            Phase::Resuming => "resuming",
        }
    }

    fn parse(s: &str) -> Result<Phase, ValueError> {
        Ok(match s {
            "preparing" => Phase::Preparing,
            "detaching" => Phase::Detaching,
            "detached" => Phase::Detached,
            "rolling-back" => Phase::RollingBack,
            "receiving" => Phase::Receiving,
            "waiting-gpu" => Phase::WaitingGpu,
            "on-cpu" => Phase::OnCpu,
            "attaching" => Phase::Attaching,
            "resuming" => Phase::Resuming,
            _ => return Err(bad("phase", s, "unknown phase")),
        })
    }

    /// Whether the entry belongs to the source side of a migration.
    pub fn is_source(self) -> bool {
        matches!(
            self,
            Phase::Preparing | Phase::Detaching | Phase::Detached | Phase::RollingBack
        )
    }
}

fn bad(key: &str, value: &str, why: &'static str) -> ValueError {
    ValueError::BadValue {
        key: key.to_string(),
        value: value.chars().take(64).collect(),
        why,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub phase: Phase,
    /// The domain the entry is about (on this host).
    pub domid: u32,
    /// Source: how the processes left the GPU.
    pub mode: Option<Mode>,
    /// Source: where the guest goes (as the wrapper named it).
    pub dest: Option<String>,
    /// Source: the GPUs the guest had (to give back on a rollback);
    /// destination: the GPU being attached.
    pub gpus: Vec<PciAddr>,
    /// The last request posted to the agent.
    pub seq: u64,
    /// The process that asked (the xl wrapper), while xl runs.
    pub owner: Option<u32>,
    pub started_ms: u64,
    /// Destination: the guest's processes were moved to its CPU for want of
    /// a GPU; the resume that gives it one moves them back home.
    pub on_cpu: bool,
    /// Destination: prepare-resume attempts that failed or went unanswered
    /// (the GPU attached), and when (ms since the epoch) the next may run.
    pub tries: u32,
    pub retry_ms: u64,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Entry {
    pub fn new(phase: Phase, domid: u32) -> Entry {
        Entry {
            phase,
            domid,
            mode: None,
            dest: None,
            gpus: Vec::new(),
            seq: 0,
            owner: None,
            started_ms: now_ms(),
            on_cpu: false,
            tries: 0,
            retry_ms: 0,
        }
    }

    pub fn format(&self) -> String {
        let mut f = Fields::new();
        f.push("phase", self.phase.as_str())
            .push("domid", self.domid.to_string());
        if let Some(m) = self.mode {
            f.push("mode", m.as_str());
        }
        if let Some(d) = &self.dest {
            f.push("dest", d.as_str());
        }
        if !self.gpus.is_empty() {
            let gpus: Vec<String> = self.gpus.iter().map(|g| g.to_string()).collect();
            f.push("gpus", gpus.join(","));
        }
        f.push("seq", self.seq.to_string());
        if let Some(o) = self.owner {
            f.push("owner", o.to_string());
        }
        f.push("started-ms", self.started_ms.to_string());
        if self.on_cpu {
            f.push("on-cpu", "1");
        }
        if self.tries > 0 {
            f.push("tries", self.tries.to_string())
                .push("retry-ms", self.retry_ms.to_string());
        }
        f.format()
    }

    pub fn parse(s: &str) -> Result<Entry, ValueError> {
        let mut f = Fields::parse(s, MAX_LEN)?;
        let phase = Phase::parse(&f.required("phase")?)?;
        let domid = u32::try_from(f.required_u64("domid")?)
            .map_err(|_| bad("domid", "", "out of range"))?;
        let mode = match f.take("mode") {
            None => None,
            Some(m) => Some(
                m.parse::<Mode>()
                    .map_err(|_| bad("mode", &m, "want remote or stop-and-copy"))?,
            ),
        };
        let dest = f.take("dest");
        let gpus = match f.take("gpus") {
            None => Vec::new(),
            Some(g) => g
                .split(',')
                .map(|p| p.parse().map_err(|_| bad("gpus", &g, "not PCI addresses")))
                .collect::<Result<_, _>>()?,
        };
        let seq = f.required_u64("seq")?;
        let owner = f
            .u64("owner")?
            .map(|o| u32::try_from(o).map_err(|_| bad("owner", "", "out of range")))
            .transpose()?;
        let started_ms = f.required_u64("started-ms")?;
        let on_cpu = match f.take("on-cpu").as_deref() {
            None => false,
            Some("1") => true,
            Some(other) => return Err(bad("on-cpu", other, "want 1")),
        };
        let tries = f
            .u64("tries")?
            .map(|t| u32::try_from(t).map_err(|_| bad("tries", "", "out of range")))
            .transpose()?
            .unwrap_or(0);
        let retry_ms = f.u64("retry-ms")?.unwrap_or(0);
        f.finish()?;
        Ok(Entry {
            phase,
            domid,
            mode,
            dest,
            gpus,
            seq,
            owner,
            started_ms,
            on_cpu,
            tries,
            retry_ms,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error(transparent)]
    Xs(#[from] XsError),
    #[error("the journal entry {key} is not valid: {source}")]
    Invalid { key: String, source: ValueError },
}

pub fn load<S: XsData>(store: &S, guest: &str) -> Result<Option<Entry>, JournalError> {
    let key = migration_key(guest);
    match store.read(&key)? {
        None => Ok(None),
        Some(v) => Entry::parse(&v)
            .map(Some)
            .map_err(|source| JournalError::Invalid { key, source }),
    }
}

pub fn save<S: XenStore>(store: &S, guest: &str, entry: &Entry) -> Result<(), JournalError> {
    store.write(&migration_key(guest), &entry.format())?;
    Ok(())
}

pub fn remove<S: XsData>(store: &S, guest: &str) -> Result<(), JournalError> {
    store.rm(&migration_key(guest))?;
    Ok(())
}

/// The guests with an entry.
pub fn guests<S: XsData>(store: &S) -> Result<Vec<String>, JournalError> {
    Ok(store.directory(DOM0_MIGRATIONS)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crane_xs::mem::MemStore;

    #[test]
    fn entries_round_trip_and_bad_ones_are_named() {
        let mut e = Entry::new(Phase::Detached, 7);
        e.mode = Some(Mode::Remote);
        e.dest = Some("host 1".into());
        e.gpus = vec![
            "0000:00:05.0".parse().unwrap(),
            "0000:00:06.0".parse().unwrap(),
        ];
        e.seq = 4;
        e.owner = Some(4242);
        assert_eq!(Entry::parse(&e.format()).unwrap(), e);
        let plain = Entry::new(Phase::WaitingGpu, 3);
        assert_eq!(Entry::parse(&plain.format()).unwrap(), plain);
        let mut retried = Entry::new(Phase::Resuming, 9);
        retried.tries = 2;
        retried.retry_ms = 1_700_000_010_000;
        assert_eq!(Entry::parse(&retried.format()).unwrap(), retried);
        for bad in [
            "phase=resuming domid=1 seq=0 started-ms=0 tries=4294967296",
            "phase=flying domid=1 seq=0 started-ms=0",
            "phase=detached seq=0 started-ms=0",
            "phase=detached domid=1 gpus=00:05 seq=0 started-ms=0",
            "phase=detached domid=1 seq=0 started-ms=0 extra=1",
        ] {
            assert!(Entry::parse(bad).is_err(), "{bad}");
        }

        let store = MemStore::new();
        let dom0 = store.connect(0);
        save(&dom0, "g", &e).unwrap();
        assert_eq!(load(&dom0, "g").unwrap(), Some(e));
        assert_eq!(guests(&dom0).unwrap(), ["g"]);
        remove(&dom0, "g").unwrap();
        assert_eq!(load(&dom0, "g").unwrap(), None);
        dom0.write(&migration_key("h"), "garbage").unwrap();
        assert!(
            load(&dom0, "h")
                .unwrap_err()
                .to_string()
                .contains("migrations/h")
        );
    }
}
