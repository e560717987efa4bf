//! An in-process XenStore with xenstored's rules for what crane relies on:
//! per-domain connections, relative paths under the domain's home, node
//! permissions (dom0 and the owner may do anything; an unprivileged creator
//! owns what it creates; children inherit their parent's list), and watches
//! that fire once when set and on every change at or below their path. It
//! backs `crane-agent --standalone` (no Xen) and unit tests; the end-to-end
//! tier runs the same code against real xenstored.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::XsError;
use crate::layout::{home, validate_path};
use crate::perms::{Access, Perm, access_for};
use crate::store::{WatchEvent, XsData, XsPerms, XsWatch};

struct Node {
    value: String,
    perms: Vec<Perm>,
}

struct Watch {
    conn: u64,
    /// Absolute.
    path: String,
    token: String,
    /// The home to strip from event paths when the watch was relative.
    relative_to: Option<String>,
}

#[derive(Default)]
struct State {
    nodes: BTreeMap<String, Node>,
    watches: Vec<Watch>,
    queues: HashMap<u64, VecDeque<WatchEvent>>,
    next_conn: u64,
}

/// The store; [`MemStore::connect`] gives a connection acting as one domain.
#[derive(Clone)]
pub struct MemStore {
    shared: Arc<(Mutex<State>, Condvar)>,
}

impl Default for MemStore {
    fn default() -> Self {
        MemStore::new()
    }
}

fn is_child_or_same(path: &str, parent: &str) -> bool {
    path == parent
        || parent == "/"
        || (path.starts_with(parent) && path.as_bytes().get(parent.len()) == Some(&b'/'))
}

fn parent_of(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&path[..i]),
        None => None,
    }
}

impl MemStore {
    /// A store holding `/local/domain`, owned by dom0 and readable by nobody
    /// else, as xenstored starts.
    pub fn new() -> MemStore {
        let mut st = State::default();
        for p in ["/", "/local", "/local/domain"] {
            st.nodes.insert(
                p.to_string(),
                Node {
                    value: String::new(),
                    perms: vec![Perm::new(0, Access::None)],
                },
            );
        }
        MemStore {
            shared: Arc::new((Mutex::new(st), Condvar::new())),
        }
    }

    /// Creates a domain's home the way the toolstack does: owned by dom0,
    /// readable by the domain.
    pub fn introduce(&self, domid: u16) {
        let dom0 = self.connect(0);
        let h = home(domid);
        dom0.write(&h, "").expect("writing a home as dom0");
        dom0.set_perms(
            &h,
            &[Perm::new(0, Access::None), Perm::new(domid, Access::Read)],
        )
        .expect("setting a home's permissions as dom0");
    }

    /// A connection acting as `domid` (0 is privileged).
    pub fn connect(&self, domid: u16) -> MemConn {
        let conn = {
            let mut st = self.lock();
            st.next_conn += 1;
            let id = st.next_conn;
            st.queues.insert(id, VecDeque::new());
            id
        };
        MemConn {
            store: self.clone(),
            domid,
            conn,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every
        // mutation is a single map operation), so poisoning is ignored.
        self.shared.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct MemConn {
    store: MemStore,
    domid: u16,
    conn: u64,
}

impl Drop for MemConn {
    fn drop(&mut self) {
        let mut st = self.store.lock();
        st.watches.retain(|w| w.conn != self.conn);
        st.queues.remove(&self.conn);
    }
}

fn refused(op: &'static str, path: &str, errno: &str) -> XsError {
    XsError::Refused {
        op,
        path: path.to_string(),
        errno: errno.to_string(),
    }
}

impl MemConn {
    pub fn domid(&self) -> u16 {
        self.domid
    }

    fn resolve(&self, path: &str) -> Result<String, XsError> {
        validate_path(path)?;
        Ok(if path.starts_with('/') || path.starts_with('@') {
            path.to_string()
        } else {
            format!("{}/{path}", home(self.domid))
        })
    }

    fn access(&self, st: &State, abs: &str) -> Access {
        st.nodes
            .get(abs)
            .map_or(Access::None, |n| access_for(&n.perms, self.domid))
    }

    fn fire(&self, st: &mut State, changed: &str) {
        let mut fired = Vec::new();
        for w in &st.watches {
            let epath = if is_child_or_same(changed, &w.path) {
                changed.to_string()
            } else if is_child_or_same(&w.path, changed) {
                // A removed parent: the event names the watched path.
                w.path.clone()
            } else {
                continue;
            };
            let epath = match &w.relative_to {
                Some(h) => epath
                    .strip_prefix(h.as_str())
                    .and_then(|p| p.strip_prefix('/'))
                    .unwrap_or(&epath)
                    .to_string(),
                None => epath,
            };
            fired.push((
                w.conn,
                WatchEvent {
                    path: epath,
                    token: w.token.clone(),
                },
            ));
        }
        for (conn, ev) in fired {
            if let Some(q) = st.queues.get_mut(&conn) {
                q.push_back(ev);
            }
        }
        self.store.shared.1.notify_all();
    }
}

impl XsData for MemConn {
    fn read(&self, path: &str) -> Result<Option<String>, XsError> {
        let abs = self.resolve(path)?;
        let st = self.store.lock();
        let Some(node) = st.nodes.get(&abs) else {
            return Ok(None);
        };
        if !access_for(&node.perms, self.domid).can_read() {
            return Err(refused("read", path, "EACCES"));
        }
        Ok(Some(node.value.clone()))
    }

    fn write(&self, path: &str, value: &str) -> Result<(), XsError> {
        let abs = self.resolve(path)?;
        let mut st = self.store.lock();
        if st.nodes.contains_key(&abs) {
            if !self.access(&st, &abs).can_write() {
                return Err(refused("write", path, "EACCES"));
            }
        } else {
            // Create the missing nodes below the nearest existing ancestor,
            // which must be writable; each inherits its parent's list, and an
            // unprivileged creator becomes the owner.
            let mut missing = vec![abs.clone()];
            let mut at = parent_of(&abs);
            while let Some(p) = at {
                if st.nodes.contains_key(p) {
                    break;
                }
                missing.push(p.to_string());
                at = parent_of(p);
            }
            let ancestor = at.unwrap_or("/").to_string();
            if !self.access(&st, &ancestor).can_write() {
                return Err(refused("write", path, "EACCES"));
            }
            let mut perms = st.nodes[&ancestor].perms.clone();
            if self.domid != 0 {
                perms[0].domid = self.domid;
            }
            for p in missing.into_iter().rev() {
                st.nodes.insert(
                    p,
                    Node {
                        value: String::new(),
                        perms: perms.clone(),
                    },
                );
            }
        }
        if let Some(n) = st.nodes.get_mut(&abs) {
            n.value = value.to_string();
        }
        self.fire(&mut st, &abs);
        Ok(())
    }

    fn rm(&self, path: &str) -> Result<(), XsError> {
        let abs = self.resolve(path)?;
        let mut st = self.store.lock();
        if !st.nodes.contains_key(&abs) {
            return Ok(());
        }
        if !self.access(&st, &abs).can_write() {
            return Err(refused("rm", path, "EACCES"));
        }
        st.nodes.retain(|p, _| !is_child_or_same(p, &abs));
        self.fire(&mut st, &abs);
        Ok(())
    }

    fn directory(&self, path: &str) -> Result<Vec<String>, XsError> {
        let abs = self.resolve(path)?;
        let st = self.store.lock();
        if !st.nodes.contains_key(&abs) {
            return Ok(Vec::new());
        }
        if !self.access(&st, &abs).can_read() {
            return Err(refused("directory", path, "EACCES"));
        }
        let prefix = if abs == "/" {
            "/".to_string()
        } else {
            format!("{abs}/")
        };
        Ok(st
            .nodes
            .range(prefix.clone()..)
            .take_while(|(p, _)| p.starts_with(&prefix))
            .filter_map(|(p, _)| {
                let rest = &p[prefix.len()..];
                (!rest.is_empty() && !rest.contains('/')).then(|| rest.to_string())
            })
            .collect())
    }
}

impl XsPerms for MemConn {
    fn get_perms(&self, path: &str) -> Result<Vec<Perm>, XsError> {
        let abs = self.resolve(path)?;
        let st = self.store.lock();
        let node = st
            .nodes
            .get(&abs)
            .ok_or_else(|| refused("get-perms", path, "ENOENT"))?;
        if !access_for(&node.perms, self.domid).can_read() {
            return Err(refused("get-perms", path, "EACCES"));
        }
        Ok(node.perms.clone())
    }

    fn set_perms(&self, path: &str, perms: &[Perm]) -> Result<(), XsError> {
        let abs = self.resolve(path)?;
        if perms.is_empty() {
            return Err(refused("set-perms", path, "EINVAL"));
        }
        let mut st = self.store.lock();
        let node = st
            .nodes
            .get(&abs)
            .ok_or_else(|| refused("set-perms", path, "ENOENT"))?;
        if !access_for(&node.perms, self.domid).can_write() {
            return Err(refused("set-perms", path, "EACCES"));
        }
        // Only dom0 gives a node away.
        if self.domid != 0 && perms[0].domid != node.perms[0].domid {
            return Err(refused("set-perms", path, "EPERM"));
        }
        if let Some(n) = st.nodes.get_mut(&abs) {
            n.perms = perms.to_vec();
        }
        self.fire(&mut st, &abs);
        Ok(())
    }
}

impl XsWatch for MemConn {
    fn watch(&self, path: &str, token: &str) -> Result<(), XsError> {
        let abs = self.resolve(path)?;
        let relative_to =
            (!path.starts_with('/') && !path.starts_with('@')).then(|| home(self.domid));
        let mut st = self.store.lock();
        st.watches.push(Watch {
            conn: self.conn,
            path: abs,
            token: token.to_string(),
            relative_to,
        });
        if let Some(q) = st.queues.get_mut(&self.conn) {
            q.push_back(WatchEvent {
                path: path.to_string(),
                token: token.to_string(),
            });
        }
        self.store.shared.1.notify_all();
        Ok(())
    }

    fn unwatch(&self, path: &str, token: &str) -> Result<(), XsError> {
        let abs = self.resolve(path)?;
        let mut st = self.store.lock();
        let before = st.watches.len();
        st.watches
            .retain(|w| !(w.conn == self.conn && w.path == abs && w.token == token));
        if st.watches.len() == before {
            return Err(refused("unwatch", path, "ENOENT"));
        }
        Ok(())
    }

    fn wait_event(&self, timeout: Duration) -> Result<Option<WatchEvent>, XsError> {
        let deadline = Instant::now() + timeout;
        let mut st = self.store.lock();
        loop {
            if let Some(ev) = st.queues.get_mut(&self.conn).and_then(|q| q.pop_front()) {
                return Ok(Some(ev));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            st = self
                .store
                .shared
                .1
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_follow_xenstored() {
        let store = MemStore::new();
        store.introduce(5);
        let dom0 = store.connect(0);
        let guest = store.connect(5);
        let other = store.connect(6);
        // The guest cannot create nodes in its dom0-owned home.
        assert!(
            guest
                .write("crane/request", "x")
                .unwrap_err()
                .is_access_denied()
        );
        dom0.write("/local/domain/5/crane/request", "seq=1")
            .unwrap();
        assert_eq!(
            guest.read("crane/request").unwrap().as_deref(),
            Some("seq=1")
        );
        assert!(
            other
                .read("/local/domain/5/crane/request")
                .unwrap_err()
                .is_access_denied()
        );
        // A guest-writable directory: what the guest creates, it owns.
        dom0.write("/local/domain/5/data", "").unwrap();
        dom0.set_perms("/local/domain/5/data", &[Perm::new(5, Access::None)])
            .unwrap();
        guest.write("data/x", "1").unwrap();
        assert_eq!(
            dom0.get_perms("/local/domain/5/data/x").unwrap()[0],
            Perm::new(5, Access::None)
        );
        // dom0 creating below keeps the inherited owner.
        dom0.write("/local/domain/5/crane/agent/y", "").unwrap();
        assert_eq!(
            dom0.get_perms("/local/domain/5/crane/agent/y").unwrap()[0].domid,
            0
        );
        assert!(
            guest
                .set_perms("data/x", &[Perm::new(6, Access::None)])
                .unwrap_err()
                .is_access_denied()
        );
        assert_eq!(
            dom0.directory("/local/domain/5").unwrap(),
            vec!["crane".to_string(), "data".to_string()]
        );
    }

    #[test]
    fn watches_fire_at_once_and_on_changes_below() {
        let store = MemStore::new();
        store.introduce(5);
        let dom0 = store.connect(0);
        let guest = store.connect(5);
        guest.watch("crane", "t").unwrap();
        let first = guest.wait_event(Duration::ZERO).unwrap().unwrap();
        assert_eq!((first.path.as_str(), first.token.as_str()), ("crane", "t"));
        assert_eq!(guest.wait_event(Duration::from_millis(5)).unwrap(), None);
        dom0.write("/local/domain/5/crane/request", "v").unwrap();
        assert_eq!(
            guest.wait_event(Duration::ZERO).unwrap().unwrap().path,
            "crane/request"
        );
        dom0.write("/local/domain/5/other", "v").unwrap();
        assert_eq!(guest.wait_event(Duration::from_millis(5)).unwrap(), None);
        dom0.rm("/local/domain/5").unwrap();
        assert_eq!(
            guest.wait_event(Duration::ZERO).unwrap().unwrap().path,
            "crane"
        );
        // Another thread's write wakes a waiter.
        let waiter = std::thread::spawn(move || guest.wait_event(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        dom0.write("/local/domain/5/crane/x", "1").unwrap();
        assert!(waiter.join().unwrap().unwrap().is_some());
    }
}
