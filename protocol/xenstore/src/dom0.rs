//! dom0's side of the protocol, for the dom0 service (and `crane-agent
//! --standalone`, which plays dom0 for `cranectl`): setting up a guest's keys
//! with the right permissions, posting requests with the next sequence number,
//! and reading the agent's answers strictly (a guest writes them).

use std::time::{Duration, Instant};

use crate::error::XsError;
use crate::layout::{
    AGENT, AGENT_APPS, AGENT_PROTOCOL, AGENT_RESPONSE, AGENT_STATE, CRANE, MAX_APPS, PROTOCOL,
    PROTOCOL_VERSION, REQUEST, absolute,
};
use crate::message::{AgentState, AppResult, Op, Request, Response, seq_hint};
use crate::perms::{Access, Perm, check_dom0_only};
use crate::store::XenStore;
use crate::value::ValueError;

#[derive(Debug, thiserror::Error)]
pub enum Dom0Error {
    #[error(transparent)]
    Xs(#[from] XsError),
    #[error("the guest's {key} is not valid: {source}")]
    Invalid { key: String, source: ValueError },
    #[error("the request is not valid: {0}")]
    InvalidRequest(ValueError),
    #[error("the guest agent speaks protocol {0:?}, dom0 {PROTOCOL_VERSION}")]
    Protocol(String),
    #[error("domain {domid} lists more than {MAX_APPS} app results")]
    TooManyApps { domid: u16 },
    #[error("no final answer to request {seq} within {ms} ms")]
    Timeout { seq: u64, ms: u128 },
    #[error("the agent did not take request {seq} within {ms} ms")]
    NotTaken { seq: u64, ms: u128 },
}

/// dom0's handle on one guest's crane keys.
pub struct GuestChannel<'a, S> {
    store: &'a S,
    domid: u16,
}

impl<'a, S: XenStore> GuestChannel<'a, S> {
    pub fn new(store: &'a S, domid: u16) -> Self {
        GuestChannel { store, domid }
    }

    fn path(&self, rel: &str) -> String {
        absolute(self.domid, rel)
    }

    fn token(&self) -> String {
        format!("crane-dom0-{}", self.domid)
    }

    /// Creates the guest's keys: `crane` owned by dom0 and readable by the
    /// guest, `crane/agent` owned by the guest. Run when the domain appears,
    /// also on a migration's destination (XenStore contents do not migrate).
    pub fn setup(&self) -> Result<(), Dom0Error> {
        let crane = self.path(CRANE);
        self.store.write(&crane, "")?;
        self.store.set_perms(
            &crane,
            &[
                Perm::new(0, Access::None),
                Perm::new(self.domid, Access::Read),
            ],
        )?;
        self.store
            .write(&self.path(PROTOCOL), &PROTOCOL_VERSION.to_string())?;
        let agent = self.path(AGENT);
        if self.store.read(&agent)?.is_none() {
            self.store.write(&agent, "")?;
        }
        self.store
            .set_perms(&agent, &[Perm::new(self.domid, Access::None)])?;
        Ok(())
    }

    fn parse<T>(
        &self,
        rel: &str,
        f: impl FnOnce(&str) -> Result<T, ValueError>,
    ) -> Result<Option<T>, Dom0Error> {
        let key = self.path(rel);
        match self.store.read(&key)? {
            None => Ok(None),
            Some(v) => f(&v)
                .map(Some)
                .map_err(|source| Dom0Error::Invalid { key, source }),
        }
    }

    /// The agent's published state; `None` before the agent started.
    pub fn agent_state(&self) -> Result<Option<AgentState>, Dom0Error> {
        if let Some(v) = self.store.read(&self.path(AGENT_PROTOCOL))?
            && v != PROTOCOL_VERSION.to_string()
        {
            return Err(Dom0Error::Protocol(v.chars().take(16).collect()));
        }
        self.parse(AGENT_STATE, AgentState::parse)
    }

    /// Waits until the agent has published its state.
    pub fn wait_agent(&self, timeout: Duration) -> Result<Option<AgentState>, Dom0Error> {
        let state = self.path(AGENT_STATE);
        self.wait_for(&state, timeout, || self.agent_state())
    }

    /// The agent's latest response.
    pub fn response(&self) -> Result<Option<Response>, Dom0Error> {
        self.parse(AGENT_RESPONSE, Response::parse)
    }

    /// The per-app results that belong to response `seq` (others are left
    /// out).
    pub fn app_results(&self, seq: u64) -> Result<Vec<AppResult>, Dom0Error> {
        let dir = self.path(AGENT_APPS);
        let names = self.store.directory(&dir)?;
        if names.len() > MAX_APPS {
            return Err(Dom0Error::TooManyApps { domid: self.domid });
        }
        let mut out = Vec::new();
        for name in names {
            let key = format!("{dir}/{name}");
            let Some(v) = self.store.read(&key)? else {
                continue;
            };
            let r = AppResult::parse(&v).map_err(|source| Dom0Error::Invalid {
                key: key.clone(),
                source,
            })?;
            if r.pid.to_string() != name {
                return Err(Dom0Error::Invalid {
                    key,
                    source: crate::value::bad_value("pid", &name, "does not match the key"),
                });
            }
            if r.seq == seq {
                out.push(r);
            }
        }
        out.sort_by_key(|r| r.pid);
        Ok(out)
    }

    /// The sequence number the next request must carry: after everything
    /// either side has seen (the agent's numbers count too: XenStore contents
    /// do not migrate, so on a guest's new host only the agent remembers where
    /// the sequence got to). A guest that claims the largest number there is
    /// gets an error, not an overflow.
    pub fn next_seq(&self) -> Result<u64, Dom0Error> {
        let posted = self
            .store
            .read(&self.path(REQUEST))?
            .map_or(0, |r| seq_hint(&r));
        let handled = self.agent_state()?.map_or(0, |s| s.last_seq);
        let answered = self.response().ok().flatten().map_or(0, |r| r.seq);
        let last = posted.max(handled).max(answered);
        last.checked_add(1).ok_or_else(|| Dom0Error::Invalid {
            key: self.path(AGENT),
            source: crate::value::bad_value(
                "seq",
                &last.to_string(),
                "no sequence number is left after it",
            ),
        })
    }

    /// Posts a request with the next sequence number; the key is owned by
    /// dom0 and only readable by the guest.
    pub fn post(&self, op: Op, deadline_ms: Option<u64>) -> Result<Request, Dom0Error> {
        let req = Request {
            seq: self.next_seq()?,
            op,
            deadline_ms,
        };
        req.validate().map_err(Dom0Error::InvalidRequest)?;
        let key = self.path(REQUEST);
        self.store.write(&key, &req.format())?;
        if check_dom0_only(&self.store.get_perms(&key)?).is_err() {
            self.store.set_perms(
                &key,
                &[
                    Perm::new(0, Access::None),
                    Perm::new(self.domid, Access::Read),
                ],
            )?;
        }
        Ok(req)
    }

    fn wait_for<T>(
        &self,
        path: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Result<Option<T>, Dom0Error>,
    ) -> Result<Option<T>, Dom0Error> {
        let token = self.token();
        self.store.watch(path, &token)?;
        let end = Instant::now() + timeout;
        let result = loop {
            match check() {
                Ok(Some(v)) => break Ok(Some(v)),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Ok(None);
            }
            if let Err(e) = self.store.wait_event(left) {
                break Err(e.into());
            }
        };
        let _ = self.store.unwatch(path, &token);
        result
    }

    /// Waits until the agent has taken request `seq`: its state names it (or
    /// a later one) as handled, or a response (`working` or final) carries it.
    /// An agent takes a request at once when it is running; one that does not
    /// is dead, stopped or stuck.
    pub fn wait_taken(&self, seq: u64, timeout: Duration) -> Result<(), Dom0Error> {
        let key = self.path(AGENT);
        self.wait_for(&key, timeout, || {
            let handled = self.agent_state()?.is_some_and(|s| s.last_seq >= seq);
            let answered = self.response()?.is_some_and(|r| r.seq >= seq);
            Ok((handled || answered).then_some(()))
        })?
        .ok_or(Dom0Error::NotTaken {
            seq,
            ms: timeout.as_millis(),
        })
    }

    /// Whether the latest request still waits for its final answer (posted,
    /// and not taken or not finished). A response the guest garbled counts as
    /// no answer.
    pub fn outstanding(&self) -> Result<bool, Dom0Error> {
        let Some(posted) = self.store.read(&self.path(REQUEST))?.map(|r| seq_hint(&r)) else {
            return Ok(false);
        };
        let answered = self
            .response()
            .ok()
            .flatten()
            .filter(|r| r.outcome.is_final())
            .map_or(0, |r| r.seq);
        Ok(posted > answered)
    }

    /// Waits for the final answer to request `seq`.
    pub fn wait_answer(&self, seq: u64, timeout: Duration) -> Result<Response, Dom0Error> {
        let key = self.path(AGENT_RESPONSE);
        self.wait_for(&key, timeout, || {
            Ok(self
                .response()?
                .filter(|r| r.seq == seq && r.outcome.is_final()))
        })?
        .ok_or(Dom0Error::Timeout {
            seq,
            ms: timeout.as_millis(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::guest::{publish_answer, publish_state};
    use crate::mem::{MemConn, MemStore};
    use crate::message::{GuestState, Outcome};
    use crate::store::XsData;

    const GUEST: u16 = 7;

    /// An in-process XenStore with the guest introduced: dom0's connection and
    /// the guest's.
    fn guest_keys() -> (MemStore, MemConn, MemConn) {
        let store = MemStore::new();
        store.introduce(GUEST);
        let (dom0, guest) = (store.connect(0), store.connect(GUEST));
        (store, dom0, guest)
    }

    fn answer(seq: u64, outcome: Outcome) -> Response {
        Response {
            seq,
            outcome,
            ms: 1.0,
            apps: 0,
            phases: Vec::new(),
            rollback: None,
            error: None,
        }
    }

    #[test]
    fn a_guest_claiming_the_last_sequence_number_gets_an_error_not_an_overflow() {
        let (_store, dom0, guest) = guest_keys();
        let ch = GuestChannel::new(&dom0, GUEST);
        ch.setup().unwrap();
        let state = AgentState {
            state: GuestState::Passthrough,
            last_seq: u64::MAX,
        };
        publish_state(&guest, &state).unwrap();
        let e = ch.post(Op::RESUME, None).unwrap_err().to_string();
        assert!(e.contains("no sequence number is left"), "{e}");
        assert!(!ch.outstanding().unwrap(), "nothing was posted");
    }

    #[test]
    fn a_request_counts_as_taken_once_the_agent_names_it_and_outstanding_until_final() {
        let (_store, dom0, guest) = guest_keys();
        let ch = GuestChannel::new(&dom0, GUEST);
        ch.setup().unwrap();
        let mut state = AgentState {
            state: GuestState::Passthrough,
            last_seq: 4,
        };
        publish_state(&guest, &state).unwrap();
        assert!(!ch.outstanding().unwrap(), "nothing posted yet");
        let req = ch.post(Op::RESUME, None).unwrap();
        assert_eq!(req.seq, 5, "after the agent's own last number");
        assert!(ch.outstanding().unwrap());
        let short = Duration::from_millis(50);
        assert!(matches!(
            ch.wait_taken(5, short),
            Err(Dom0Error::NotTaken { seq: 5, .. })
        ));
        // A working answer takes it; only a final one ends it.
        state.state = GuestState::Resuming;
        state.last_seq = 5;
        publish_state(&guest, &state).unwrap();
        ch.wait_taken(5, short).unwrap();
        assert!(ch.outstanding().unwrap());
        state.state = GuestState::Passthrough;
        publish_answer(&guest, &state, &answer(5, Outcome::Resumed), &[]).unwrap();
        assert!(!ch.outstanding().unwrap());
        assert_eq!(ch.wait_answer(5, short).unwrap().outcome, Outcome::Resumed);
        // A garbled response is no answer: the next request stays outstanding.
        ch.post(Op::RESUME, None).unwrap();
        guest
            .write(&absolute(GUEST, AGENT_RESPONSE), "seq=6 outcome=explode")
            .unwrap();
        assert!(ch.outstanding().unwrap());
    }
}
