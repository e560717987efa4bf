//! The guest agent's side of the protocol: reading dom0's request with every
//! check it must pass, and publishing the agent's state and answers. Paths are
//! relative to the guest's home (see [`crate::layout`]).

use crate::error::XsError;
use crate::layout::{
    AGENT_APPS, AGENT_PROTOCOL, AGENT_RESPONSE, AGENT_STATE, PROTOCOL, PROTOCOL_VERSION, REQUEST,
    app_key,
};
use crate::message::{AgentState, AppResult, Request, Response, SeqCheck, check_seq, seq_hint};
use crate::perms::check_dom0_only;
use crate::store::{XsData, XsPerms};

/// What the request key holds, judged against the last sequence number the
/// agent acted upon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// No request.
    Nothing,
    /// The request already handled (watches fire again and spuriously).
    Repeat,
    New(Request),
    /// Not to be acted upon; `seq` is the request's if it could be read, else
    /// 0. The reason never quotes the request (it may hold a token).
    Rejected {
        seq: u64,
        reason: String,
    },
}

/// Reads and checks `crane/request`: it must have been written by dom0 alone
/// (owner dom0, no other domain may write it, from `XS_GET_PERMS`), speak this
/// protocol, parse strictly, and carry a sequence number after `last_seq`.
pub fn read_request<S: XsData + XsPerms>(store: &S, last_seq: u64) -> Result<Incoming, XsError> {
    let Some(raw) = store.read(REQUEST)? else {
        return Ok(Incoming::Nothing);
    };
    let perms = match store.get_perms(REQUEST) {
        Ok(p) => p,
        // Removed between the two reads: nothing pending.
        Err(e) if e.is_not_found() => return Ok(Incoming::Nothing),
        Err(e) => return Err(e),
    };
    let seq = seq_hint(&raw);
    if let Err(why) = check_dom0_only(&perms) {
        return Ok(Incoming::Rejected {
            seq,
            reason: format!("request not written by dom0 alone: {why}"),
        });
    }
    if let Some(v) = store.read(PROTOCOL)?
        && v != PROTOCOL_VERSION.to_string()
    {
        return Ok(Incoming::Rejected {
            seq,
            reason: format!(
                "dom0 speaks protocol {:?}, the agent {PROTOCOL_VERSION}",
                v.chars().take(16).collect::<String>()
            ),
        });
    }
    let req = match Request::parse(&raw) {
        Ok(r) => r,
        Err(e) => {
            return Ok(Incoming::Rejected {
                seq,
                reason: format!("malformed request: {e}"),
            });
        }
    };
    Ok(match check_seq(last_seq, req.seq) {
        SeqCheck::New => Incoming::New(req),
        SeqCheck::Repeat => Incoming::Repeat,
        SeqCheck::Stale => Incoming::Rejected {
            seq: req.seq,
            reason: format!(
                "out of sequence: seq {} is not after the last handled {last_seq}",
                req.seq
            ),
        },
    })
}

/// Publishes the agent's protocol version and state.
pub fn publish_state<S: XsData>(store: &S, state: &AgentState) -> Result<(), XsError> {
    store.write(AGENT_PROTOCOL, &PROTOCOL_VERSION.to_string())?;
    store.write(AGENT_STATE, &state.format())
}

/// The state the agent last published (after a restart, its last sequence
/// number); `None` when absent or unreadable.
pub fn published_state<S: XsData>(store: &S) -> Option<AgentState> {
    let raw = store.read(AGENT_STATE).ok()??;
    AgentState::parse(&raw).ok()
}

/// Publishes an answer: the per-app results (the old ones removed) and the
/// agent's new state first, the response last, so a reader that sees the
/// response sees the results and state that go with it.
pub fn publish_answer<S: XsData>(
    store: &S,
    state: &AgentState,
    response: &Response,
    apps: &[AppResult],
) -> Result<(), XsError> {
    store.rm(AGENT_APPS)?;
    for a in apps {
        store.write(&app_key(a.pid), &a.format())?;
    }
    publish_state(store, state)?;
    store.write(AGENT_RESPONSE, &response.format())
}

/// Publishes an intermediate (`working`) response without touching results.
pub fn publish_progress<S: XsData>(store: &S, response: &Response) -> Result<(), XsError> {
    store.write(AGENT_RESPONSE, &response.format())
}
