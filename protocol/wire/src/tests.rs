use std::io::Write;
use std::os::unix::net::UnixStream;

use rand::{Rng, SeedableRng, rngs::StdRng};

use super::*;

fn sample_calls() -> Vec<Call> {
    vec![
        Call::Hello {
            major: VERSION_MAJOR,
            minor: VERSION_MINOR,
            token: "secret".into(),
            client: "app[42]".into(),
        },
        Call::CreateBuffer {
            id: 7,
            context: 2,
            flags: 1,
            size: 4096,
            props: vec![],
            init: true,
        },
        Call::SetKernelArg {
            kernel: 9,
            index: 3,
            arg: KernelArg::Bytes(vec![1, 2, 3, 4]),
        },
        Call::EnqueueNdRange {
            queue: 3,
            kernel: 9,
            dims: 2,
            offset: None,
            global: [1024, 768, 1],
            local: Some([16, 16, 1]),
            sync: Sync {
                waits: vec![11, 12],
                event: 13,
            },
        },
        Call::GetInfo {
            kind: InfoKind::KernelSubGroup {
                device: 4,
                input: vec![8, 0, 0, 0],
            },
            object: 9,
            param: 0x2033,
        },
        Call::Sync,
        Call::DescribeKernel {
            kernel: 9,
            devices: vec![4, 5],
        },
        Call::JoinLane {
            session: 12,
            lane: 3,
            secret: [0xA5; LANE_SECRET_LEN],
        },
        Call::EnqueueWriteLane {
            queue: 3,
            buffer: 7,
            offset: 1 << 20,
            key: 99,
            sync: Sync::default(),
        },
    ]
}

#[test]
fn a_lane_answer_round_trips() {
    let a = Answer::Lanes {
        status: 0,
        count: 4,
        secret: std::array::from_fn(|i| i as u8),
    };
    let mut buf = Vec::new();
    encode(&mut buf, 5, &a, 0).unwrap();
    let h = Header::parse(buf[..HEADER_LEN].try_into().unwrap(), 0).unwrap();
    assert_eq!(h.seq, 5);
    assert_eq!(decode::<Answer>(&buf[HEADER_LEN..]).unwrap(), a);
    assert!(Call::OpenLanes { count: 2 }.replies());
    assert!(!Call::LanePiece { key: 1 }.replies());
}

#[test]
fn a_kernel_description_round_trips() {
    let a = Answer::Kernel {
        status: 0,
        args: vec![ArgDesc {
            status: 0,
            address: 0x119B,
            access: 0x11A3,
            type_qualifier: 1,
            type_name: "float4*".into(),
        }],
        devices: vec![KernelDevice {
            device: 4,
            status: 0,
            work_group_size: 256,
            compile_work_group_size: [8, 4, 1],
            max_dims: 3,
            max_item_sizes: [1024, 1024, 64],
            max_work_group_size: 1024,
            non_uniform: true,
        }],
    };
    let mut out = Vec::new();
    encode(&mut out, 0, &a, 0).unwrap();
    let body = &out[HEADER_LEN..];
    assert_eq!(decode::<Answer>(body).unwrap(), a);
}

#[test]
fn header_round_trips_and_rejects_bad_magic_and_sizes() {
    let h = Header {
        body_len: 17,
        payload_len: 1 << 33,
        seq: 99,
    };
    let b = h.to_bytes();
    assert_eq!(Header::parse(&b, u64::MAX).unwrap(), h);
    assert!(matches!(
        Header::parse(&b, 1 << 20),
        Err(WireError::PayloadTooLarge { got, limit }) if got == 1 << 33 && limit == 1 << 20
    ));
    let mut bad = b;
    bad[0] ^= 1;
    assert!(matches!(
        Header::parse(&bad, u64::MAX),
        Err(WireError::BadMagic(_))
    ));
    let big = Header {
        body_len: MAX_BODY + 1,
        payload_len: 0,
        seq: 1,
    };
    assert!(matches!(
        Header::parse(&big.to_bytes(), u64::MAX),
        Err(WireError::BodyTooLarge(n)) if n == MAX_BODY + 1
    ));
}

#[test]
fn frames_cross_a_real_socket_with_payloads() {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let calls = sample_calls();
    let writer = {
        let calls = calls.clone();
        std::thread::spawn(move || {
            let mut out = Vec::new();
            for (i, c) in calls.iter().enumerate() {
                let payload = vec![i as u8; i * 1000];
                encode(&mut out, i as u64 + 1, c, payload.len() as u64).unwrap();
                out.extend_from_slice(&payload);
            }
            // Dribble the bytes to exercise partial reads.
            for chunk in out.chunks(7) {
                a.write_all(chunk).unwrap();
            }
        })
    };
    let mut body = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        let h = read_frame(&mut b, 1 << 20, &mut body).unwrap().unwrap();
        assert_eq!(h.seq, i as u64 + 1);
        assert_eq!(&decode::<Call>(&body).unwrap(), c);
        let mut payload = vec![0u8; h.payload_len as usize];
        std::io::Read::read_exact(&mut b, &mut payload).unwrap();
        assert_eq!(payload, vec![i as u8; i * 1000]);
    }
    writer.join().unwrap();
    assert!(read_frame(&mut b, 1 << 20, &mut body).unwrap().is_none());
}

#[test]
fn truncated_frames_are_errors_not_hangs() {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let mut out = Vec::new();
    encode(&mut out, 1, &Call::Sync, 0).unwrap();
    a.write_all(&out[..HEADER_LEN - 3]).unwrap();
    drop(a);
    let mut body = Vec::new();
    assert!(matches!(
        read_frame(&mut b, 0, &mut body),
        Err(WireError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof
    ));
}

#[test]
fn trailing_bytes_in_a_body_are_rejected() {
    let mut out = Vec::new();
    encode(&mut out, 1, &Call::Sync, 0).unwrap();
    let mut body = out[HEADER_LEN..].to_vec();
    body.push(0);
    assert!(decode::<Call>(&body).is_err());
}

/// The decoder is fed random bytes and mutations of valid messages: it must
/// return an error or a message, never panic or allocate without bound.
#[test]
fn decoder_survives_fuzzing() {
    let mut rng = StdRng::seed_from_u64(0x63_7261_6e65);
    let mut valid = Vec::new();
    for c in sample_calls() {
        let mut out = Vec::new();
        encode(&mut out, 1, &c, 0).unwrap();
        valid.push(out[HEADER_LEN..].to_vec());
    }
    for a in [
        Answer::Count {
            status: 0,
            count: 3,
        },
        Answer::Formats {
            status: 0,
            formats: vec![ImageFormat {
                order: 1,
                data_type: 2,
            }],
        },
        Answer::Failed { seq: 5, status: -5 },
    ] {
        let mut out = Vec::new();
        encode(&mut out, 1, &a, 0).unwrap();
        valid.push(out[HEADER_LEN..].to_vec());
    }
    let mut decoded = 0;
    for i in 0..200_000 {
        let body: Vec<u8> = if i % 2 == 0 {
            let n = rng.random_range(0..64);
            (0..n).map(|_| rng.random()).collect()
        } else {
            let mut b = valid[rng.random_range(0..valid.len())].clone();
            for _ in 0..rng.random_range(1..4) {
                match rng.random_range(0..3) {
                    0 if !b.is_empty() => {
                        let j = rng.random_range(0..b.len());
                        b[j] = rng.random();
                    }
                    1 if !b.is_empty() => {
                        b.truncate(rng.random_range(0..b.len()));
                    }
                    _ => {
                        // A huge varint length where a length is expected.
                        let j = rng.random_range(0..=b.len());
                        b.splice(j..j, [0xff, 0xff, 0xff, 0xff, 0x0f]);
                    }
                }
            }
            b
        };
        if decode::<Call>(&body).is_ok() {
            decoded += 1;
        }
        let _ = decode::<Answer>(&body);
        let mut h = [0u8; HEADER_LEN];
        rng.fill(&mut h[..]);
        if i % 3 == 0 {
            h[..4].copy_from_slice(&MAGIC.to_le_bytes());
        }
        if let Ok(p) = Header::parse(&h, 1 << 30) {
            assert!(p.body_len <= MAX_BODY && p.payload_len <= 1 << 30);
        }
    }
    // Mutations keep some messages valid: the fuzzer reaches the decoder's
    // success paths, not only its first check.
    assert!(decoded > 1000, "only {decoded} inputs decoded");
}
