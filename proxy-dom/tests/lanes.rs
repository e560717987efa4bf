//! Lanes (wire 1.6): extra connections that carry a session's bulk data.
//! Pieces spread over lanes, in any order, land where the session's writes
//! say; a lane needs its session's secret, a granted number and a free
//! one; a lane that misbehaves is closed and its session goes on; a piece
//! that can no longer come fails its write, not the session.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use crane_wire::{Answer, Call, LANE_HELD, LANE_PIECE_MAX, LANE_SECRET_LEN, Sync};

const CL_INVALID_VALUE: i32 = -30;

type Secret = [u8; LANE_SECRET_LEN];

fn open_lanes(c: &mut Client, count: u32) -> (u32, Secret) {
    match c.call(Call::OpenLanes { count }, &[]) {
        (
            Answer::Lanes {
                status: CL_SUCCESS,
                count,
                secret,
            },
            _,
        ) => (count, secret),
        other => panic!("OpenLanes answered {other:?}"),
    }
}

/// A lane's connection after its JoinLane: Ok, or the Goodbye's reason.
fn join(addr: SocketAddr, session: u64, lane: u32, secret: Secret) -> Result<Lane, String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    s.write_all(&frame(
        1,
        &Call::JoinLane {
            session,
            lane,
            secret,
        },
        &[],
    ))
    .unwrap();
    let mut body = Vec::new();
    let h = crane_wire::read_frame(&mut s, 0, &mut body)
        .map_err(|e| e.to_string())?
        .ok_or("closed without an answer")?;
    match crane_wire::decode::<Answer>(&body).unwrap() {
        Answer::Status(CL_SUCCESS) if h.seq == 1 => Ok(Lane { s, seq: 1 }),
        Answer::Goodbye { reason } => Err(reason),
        a => Err(format!("answered {a:?}")),
    }
}

struct Lane {
    s: TcpStream,
    seq: u64,
}

impl Lane {
    fn piece(&mut self, key: u64, data: &[u8]) {
        self.seq += 1;
        self.send(&Call::LanePiece { key }, data);
    }

    fn send(&mut self, call: &Call, data: &[u8]) {
        // A lane the proxy closed may refuse the bytes; the tests look at
        // what the proxy did.
        let _ = self.s.write_all(&frame(self.seq, call, data));
    }

    /// Whether the proxy closed the lane (after a Goodbye, if any): its
    /// reason.
    fn closed(&mut self) -> Option<String> {
        let mut body = Vec::new();
        loop {
            match crane_wire::read_frame(&mut self.s, 0, &mut body) {
                Ok(Some(_)) => {
                    if let Ok(Answer::Goodbye { reason }) = crane_wire::decode::<Answer>(&body) {
                        return Some(reason);
                    }
                }
                Ok(None) | Err(_) => return None,
            }
        }
    }
}

fn write_lane(c: &mut Client, env: &Env, buffer: u64, offset: u64, key: u64) -> u64 {
    c.send(
        Call::EnqueueWriteLane {
            queue: env.queue,
            buffer,
            offset,
            key,
            sync: Sync::default(),
        },
        &[],
    )
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

#[test]
fn pieces_over_lanes_land_where_the_sessions_writes_say() {
    let p = TestProxy::start(|_| {});
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    let (granted, secret) = open_lanes(&mut c, 3);
    assert_eq!(granted, 3);
    // Asking again: the same secret.
    assert_eq!(open_lanes(&mut c, 3), (3, secret));
    let mut lanes: Vec<Lane> = (0..3)
        .map(|l| join(p.tcp(), c.session, l, secret).unwrap())
        .collect();
    // Three buffers of 5 pieces of 96 KiB; piece i on lane i % 3. The
    // writes go first (the session waits for their pieces), and the lanes
    // send in reverse lane order, more pieces than a lane may hold.
    const PIECE: usize = 96 << 10;
    let data: Vec<Vec<u8>> = (0..3).map(|b| pattern(5 * PIECE, b as u8)).collect();
    let bufs: Vec<u64> = (0..3)
        .map(|_| create_buffer(&mut c, &env, CL_MEM_READ_WRITE, (5 * PIECE) as u64, None))
        .collect();
    let mut key = 1000;
    let mut plan = Vec::new();
    for (b, d) in data.iter().enumerate() {
        for i in 0..5 {
            write_lane(&mut c, &env, bufs[b], (i * PIECE) as u64, key);
            plan.push((key, &d[i * PIECE..(i + 1) * PIECE]));
            key += 1;
        }
    }
    assert!(plan.len() / 3 > LANE_HELD);
    std::thread::scope(|s| {
        for (l, lane) in lanes.iter_mut().enumerate().rev() {
            let mine: Vec<_> = plan
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 3 == l)
                .map(|(_, p)| *p)
                .collect();
            s.spawn(move || {
                for (key, piece) in mine {
                    lane.piece(key, piece);
                }
            });
        }
    });
    assert_eq!(c.sync(), vec![]);
    for (b, d) in data.iter().enumerate() {
        assert!(read(&mut c, &env, bufs[b], d.len() as u64, vec![]) == *d);
    }
    // Lanes closed by the client: a write whose piece never came fails,
    // at once, and the session goes on.
    drop(lanes);
    let missing = write_lane(&mut c, &env, bufs[0], 0, 1);
    assert_eq!(c.sync(), vec![(missing, CL_INVALID_VALUE)]);
    assert!(read(&mut c, &env, bufs[0], data[0].len() as u64, vec![]) == data[0]);
}

#[test]
fn a_lane_needs_its_sessions_secret_a_granted_number_and_a_free_one() {
    let p = TestProxy::start(|_| {});
    let mut a = p.client(TOKEN_A);
    let mut b = p.client(TOKEN_B);
    let (_, secret_a) = open_lanes(&mut a, 2);
    let (_, secret_b) = open_lanes(&mut b, 2);
    assert_ne!(secret_a, secret_b);
    let refused = |session, lane, secret| join(p.tcp(), session, lane, secret).err().unwrap();
    // Another session's secret, a forged one, a session without lanes.
    assert!(refused(a.session, 0, secret_b).contains("secret"));
    assert!(refused(b.session, 0, secret_a).contains("secret"));
    assert!(refused(a.session, 0, [0; LANE_SECRET_LEN]).contains("secret"));
    let c = p.client(TOKEN_A);
    assert!(refused(c.session, 0, secret_a).contains("secret"));
    // Not granted; taken.
    assert!(refused(a.session, 2, secret_a).contains("not granted"));
    let _lane = join(p.tcp(), a.session, 1, secret_a).unwrap();
    assert!(refused(a.session, 1, secret_a).contains("already"));
    // A lane is no session: a Hello-less session call, and calls of a
    // session on a lane, are refused.
    let mut lane0 = join(p.tcp(), a.session, 0, secret_a).unwrap();
    lane0.seq += 1;
    lane0.send(&Call::Sync, &[]);
    assert!(lane0.closed().unwrap().contains("pieces only"));
    // The sessions go on; lane 0 is free again.
    assert_eq!(a.sync(), vec![]);
    assert_eq!(b.sync(), vec![]);
    assert!(join(p.tcp(), a.session, 0, secret_a).is_ok());
    // Ended with its session: the secret opens nothing any more.
    let session_b = b.session;
    drop(b);
    let deadline = std::time::Instant::now() + LONG;
    loop {
        match join(p.tcp(), session_b, 1, secret_b) {
            Err(e) if e.contains("secret") => break,
            _ => assert!(
                std::time::Instant::now() < deadline,
                "b's lanes outlived it"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_misbehaving_lane_is_closed_and_its_session_goes_on() {
    let p = TestProxy::start(|_| {});
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    let (_, secret) = open_lanes(&mut c, 4);
    let buf = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 4096, None);
    let data = pattern(4096, 9);
    // A piece past the largest: the lane ends.
    let mut big = join(p.tcp(), c.session, 0, secret).unwrap();
    big.seq += 1;
    let mut h = frame(big.seq, &Call::LanePiece { key: 1 }, &[]);
    h[8..16].copy_from_slice(&(LANE_PIECE_MAX + 1).to_le_bytes());
    let _ = big.s.write_all(&h);
    assert!(big.closed().unwrap().contains("exceeds"));
    // The same key twice.
    let mut twice = join(p.tcp(), c.session, 1, secret).unwrap();
    twice.piece(7, &data);
    twice.piece(7, &data);
    assert!(twice.closed().unwrap().contains("twice"));
    // An empty piece; a sequence number that goes back.
    let mut empty = join(p.tcp(), c.session, 2, secret).unwrap();
    empty.piece(8, &[]);
    assert!(empty.closed().unwrap().contains("empty"));
    let mut back = join(p.tcp(), c.session, 3, secret).unwrap();
    back.piece(9, &data);
    back.seq = 1;
    back.piece(10, &data);
    assert!(back.closed().unwrap().contains("sequence"));
    // The piece delivered before the lane went wrong is still written.
    write_lane(&mut c, &env, buf, 0, 7);
    write_lane(&mut c, &env, buf, 0, 9);
    assert_eq!(c.sync(), vec![]);
    assert!(read(&mut c, &env, buf, 4096, vec![]) == data);
    // Every lane closed: a piece that did not come fails its write.
    let lost = write_lane(&mut c, &env, buf, 0, 10);
    assert_eq!(c.sync(), vec![(lost, CL_INVALID_VALUE)]);
}

#[test]
fn pieces_belong_to_their_session_and_lanes_are_asked_for_first() {
    let p = TestProxy::start(|_| {});
    let mut a = p.client(TOKEN_A);
    let mut b = p.client(TOKEN_A);
    let env_a = setup(&mut a);
    let env_b = setup(&mut b);
    let (_, secret_a) = open_lanes(&mut a, 1);
    let (_, secret_b) = open_lanes(&mut b, 1);
    let buf_a = create_buffer(&mut a, &env_a, CL_MEM_READ_WRITE, 4096, None);
    let buf_b = create_buffer(&mut b, &env_b, CL_MEM_READ_WRITE, 4096, None);
    let secret_data = pattern(4096, 77);
    let mut lane = join(p.tcp(), a.session, 0, secret_a).unwrap();
    lane.piece(5, &secret_data);
    // b's own lane comes and goes without a piece; b names a's key while
    // a's piece waits: b sees only its own lanes' pieces.
    drop(join(p.tcp(), b.session, 0, secret_b).unwrap());
    let stolen = write_lane(&mut b, &env_b, buf_b, 0, 5);
    let failed = b.sync();
    assert_eq!(failed, vec![(stolen, CL_INVALID_VALUE)]);
    assert!(read(&mut b, &env_b, buf_b, 4096, vec![]) != secret_data);
    write_lane(&mut a, &env_a, buf_a, 0, 5);
    assert_eq!(a.sync(), vec![]);
    assert!(read(&mut a, &env_a, buf_a, 4096, vec![]) == secret_data);
    // A session that never asked for lanes: a write over a lane is a
    // violation.
    let mut c = p.client(TOKEN_A);
    let env_c = setup(&mut c);
    let buf_c = create_buffer(&mut c, &env_c, CL_MEM_READ_WRITE, 4096, None);
    write_lane(&mut c, &env_c, buf_c, 0, 5);
    assert!(c.closed(LONG).unwrap().contains("without lanes"));
}
