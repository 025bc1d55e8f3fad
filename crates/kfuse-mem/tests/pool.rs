//! The dedup pool: sharing within a domain, never across, copy-on-write isolation, handles
//! passed over sockets with domain checks and seal checks, and aging.

mod common;

use std::os::unix::net::UnixStream;

use common::page_of;
use kfuse_mem::pool::{Handle, Pool, PoolOptions};
use kfuse_mem::process::Domain;
use kfuse_mem::{sys, MemError};

fn pages(seeds: &[u64]) -> Vec<u8> {
    seeds.iter().flat_map(|s| page_of(*s)).collect()
}

fn me() -> Domain {
    Domain::Uid(sys::effective_uid())
}

#[test]
fn identical_chunks_are_stored_once_within_a_domain() {
    let page = sys::page_size() as u64;
    let mut pool = Pool::new(me(), PoolOptions::default()).unwrap();
    let a = pages(&[1, 2, 3, 4]);
    // B shares pages 2 and 3 with A and ends in a partial page.
    let mut b = pages(&[2, 3, 9]);
    b.truncate(b.len() - 100);
    let map_a = pool.insert("a", &a).unwrap();
    let map_b = pool.insert("b", &b).unwrap();
    assert_eq!(map_a.as_slice(), &a[..]);
    assert_eq!(map_b.as_slice(), &b[..]);
    // A's pages were unique when inserted, so they stayed private; B's first two were promoted
    // into the pool when B brought them again.
    assert_eq!(map_a.private_pages(), 4);
    assert_eq!(map_b.private_pages(), 1);
    let stats = pool.stats();
    assert_eq!(stats.logical_bytes, 7 * page);
    assert_eq!(stats.pooled_bytes, 2 * page);
    assert_eq!(
        stats.private_bytes,
        3 * page,
        "A's pages 1 and 4, B's page 9"
    );
    assert_eq!(stats.saved_bytes, 2 * page);
    assert!((stats.sharing_factor - 7.0 / 5.0).abs() < 1e-12);
}

#[test]
fn refresh_moves_a_holder_onto_the_shared_copy_and_keeps_its_own_writes() {
    let page = sys::page_size();
    let mut pool = Pool::new(me(), PoolOptions::default()).unwrap();
    let a = pages(&[1, 2, 3]);
    let mut map_a = pool.insert("a", &a).unwrap();
    // A writes to its page 3 before anyone shares it.
    map_a.as_mut_slice()[2 * page] ^= 0xff;
    let _map_b = pool.insert("b", &pages(&[2, 3])).unwrap();
    assert_eq!(map_a.private_pages(), 3);
    let moved = pool.refresh(&mut map_a).unwrap();
    assert_eq!(
        moved, 1,
        "page 2 moves onto the pool; page 3 was written and stays A's"
    );
    assert_eq!(map_a.private_pages(), 2);
    let mut expected = a.clone();
    expected[2 * page] ^= 0xff;
    assert_eq!(map_a.as_slice(), &expected[..]);
}

#[test]
fn writes_to_a_mapping_never_reach_the_pool_or_other_holders() {
    for same_behaviour in [false, true] {
        let mut pool = Pool::new(me(), PoolOptions { same_behaviour }).unwrap();
        let data = pages(&[5, 6, 7]);
        let mut first = pool.insert("w", &data).unwrap();
        let mut held = first.as_slice().to_vec();
        let handle = pool.share(&mut first).unwrap();
        let mut second = handle.map().unwrap();
        second.as_mut_slice().fill(0xAB);
        assert_eq!(
            first.as_slice(),
            &data[..],
            "same_behaviour={same_behaviour}"
        );
        let third = pool.map("w").unwrap();
        assert_eq!(third.as_slice(), &data[..]);
        first.as_mut_slice()[0] ^= 1;
        held[0] ^= 1;
        assert_eq!(first.as_slice(), &held[..]);
        assert_eq!(pool.map("w").unwrap().as_slice(), &data[..]);
    }
}

#[test]
fn same_behaviour_mode_puts_every_chunk_in_the_pool() {
    let mut pool = Pool::new(
        me(),
        PoolOptions {
            same_behaviour: true,
        },
    )
    .unwrap();
    let data = pages(&[1, 2, 1, 2, 3]);
    let mapping = pool.insert("x", &data).unwrap();
    assert_eq!(mapping.private_pages(), 0);
    assert_eq!(mapping.as_slice(), &data[..]);
    let stats = pool.stats();
    assert_eq!(
        stats.pooled_bytes,
        3 * sys::page_size() as u64,
        "repeats inside one entry dedup"
    );
    assert!(
        pool.handle("x").is_ok(),
        "everything is pooled, so a handle needs no share"
    );
}

#[test]
fn empty_and_tiny_entries_work() {
    let mut pool = Pool::new(
        me(),
        PoolOptions {
            same_behaviour: true,
        },
    )
    .unwrap();
    assert_eq!(pool.insert("empty", &[]).unwrap().as_slice(), &[] as &[u8]);
    assert_eq!(pool.insert("one", &[42]).unwrap().as_slice(), &[42]);
    assert!(matches!(pool.insert("one", &[1]), Err(MemError::Usage(_))));
    assert!(matches!(pool.map("absent"), Err(MemError::Usage(_))));
}

#[test]
fn entries_of_different_domains_never_share() {
    let mut a = Pool::new(
        Domain::Uid(1),
        PoolOptions {
            same_behaviour: true,
        },
    )
    .unwrap();
    let mut b = Pool::new(
        Domain::Uid(2),
        PoolOptions {
            same_behaviour: true,
        },
    )
    .unwrap();
    let data = pages(&[1, 2]);
    a.insert("w", &data).unwrap();
    b.insert("w", &data).unwrap();
    // Each domain stores its own copy.
    assert_eq!(a.stats().saved_bytes, 0);
    assert_eq!(b.stats().saved_bytes, 0);
    assert_eq!(b.stats().pooled_bytes, 2 * sys::page_size() as u64);
}

#[test]
fn handles_pass_over_sockets_to_the_same_domain_only() {
    let data = pages(&[3, 1, 4, 1, 5]);
    let mut pool = Pool::new(me(), PoolOptions::default()).unwrap();
    let mut mapping = pool.insert("weights", &data).unwrap();
    pool.share(&mut mapping).unwrap();
    let (server, client) = UnixStream::pair().unwrap();
    pool.serve(&server, "weights").unwrap();
    let received = Handle::receive(&client).unwrap();
    assert_eq!(received.name(), "weights");
    assert_eq!(received.map().unwrap().as_slice(), &data[..]);

    // A pool of another domain refuses this process, and says why.
    let mut other = Pool::new(
        Domain::Uid(sys::effective_uid() + 1),
        PoolOptions::default(),
    )
    .unwrap();
    let mut mapping = other.insert("weights", &data).unwrap();
    other.share(&mut mapping).unwrap();
    let (server, client) = UnixStream::pair().unwrap();
    let refused = other.serve(&server, "weights");
    assert!(matches!(refused, Err(MemError::Refused(_))), "{refused:?}");
    match Handle::receive(&client) {
        Err(MemError::Refused(reason)) => assert!(reason.contains("this pool serves"), "{reason}"),
        other => panic!("expected a refusal, got {:?}", other.err()),
    }
}

#[test]
fn a_handle_with_an_unsealed_or_malformed_segment_is_refused() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let page = sys::page_size();
    let send = |text: &str, fds: &[i32]| {
        let (a, b) = UnixStream::pair().unwrap();
        sys::send_with_fds(&a, &(text.len() as u64).to_le_bytes(), fds).unwrap();
        (&a).write_all(text.as_bytes()).unwrap();
        Handle::receive(&b)
    };
    let mut unsealed = sys::memfd("unsealed").unwrap();
    unsealed.write_all(&vec![0u8; page]).unwrap();
    let text = format!("kfuse-pool 1\nw\n{page}\n1\n0 0\n");
    let result = send(&text, &[unsealed.as_raw_fd()]);
    assert!(
        matches!(&result, Err(MemError::BadHandle(m)) if m.contains("not sealed")),
        "{:?}",
        result.err()
    );
    sys::add_seals(&unsealed, sys::FULL_SEALS).unwrap();
    assert!(send(&text, &[unsealed.as_raw_fd()]).is_ok());
    for bad in [
        "kfuse-pool 2\nw\n1\n1\n0 0\n".to_string(),
        format!("kfuse-pool 1\nw\n{page}\n1\n0 {page}\n"),
        format!("kfuse-pool 1\nw\n{page}\n2\n0 0\n"),
        format!("kfuse-pool 1\nw\n{}\n1\n0 0\n", 2 * page),
        "kfuse-pool 1\nw\nnot-a-number\n1\n".to_string(),
    ] {
        let result = send(&bad, &[unsealed.as_raw_fd()]);
        assert!(matches!(result, Err(MemError::BadHandle(_))), "{bad:?}");
    }
    // An offset whose end wraps past 2^64 to 0.
    let wrapping = format!(
        "kfuse-pool 1\nw\n{page}\n1\n0 {}\n",
        u64::MAX - page as u64 + 1
    );
    match send(&wrapping, &[unsealed.as_raw_fd()]) {
        Err(MemError::BadHandle(m)) => assert!(m.contains("outside its segment"), "{m}"),
        other => panic!("a wrapping offset was accepted: {:?}", other.err()),
    }
}

/// A process that connects to `socket` and exits at once; returns its pid once it is reaped,
/// when its pid is free for any new process to take.
fn connect_and_vanish(socket: &std::path::Path) -> u32 {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, from) in address
        .sun_path
        .iter_mut()
        .zip(socket.as_os_str().as_bytes())
    {
        *to = *from as libc::c_char;
    }
    // SAFETY: the child only makes system calls before `_exit`, which is safe after fork in a
    // threaded process; the parent waits for it.
    unsafe {
        let child = libc::fork();
        assert!(child >= 0, "fork failed");
        if child == 0 {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let connected = libc::connect(
                fd,
                &address as *const libc::sockaddr_un as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            libc::_exit(if connected == 0 { 0 } else { 1 });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(child, &mut status, 0), child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        child as u32
    }
}

/// A pool of a cgroup domain reads the peer's cgroup from `/proc/<pid>`, which names another
/// process once the peer is gone. The peer is pinned by a pidfd, so a peer that vanished is
/// refused even when `/proc/<its pid>` (here a copy the test writes) shows the right cgroup.
#[test]
fn a_peer_that_vanished_is_refused_even_if_its_pid_shows_the_right_domain() {
    let dir = std::env::temp_dir().join(format!("kfuse-pool-pidfd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fake_proc = dir.join("proc");
    let in_tenant = |pid: u32| {
        std::fs::create_dir_all(fake_proc.join(pid.to_string())).unwrap();
        std::fs::write(fake_proc.join(format!("{pid}/cgroup")), "0::/tenant-a\n").unwrap();
    };
    let data = pages(&[2, 7, 1]);
    let mut pool = Pool::new(Domain::Cgroup("/tenant-a".into()), PoolOptions::default()).unwrap();
    pool.set_procfs(kfuse_mem::process::Procfs::at(&fake_proc));
    let mut mapping = pool.insert("weights", &data).unwrap();
    pool.share(&mut mapping).unwrap();
    let socket = dir.join("pool.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();

    // A live peer of the domain is served.
    let client = UnixStream::connect(&socket).unwrap();
    let (server, _) = listener.accept().unwrap();
    in_tenant(std::process::id());
    pool.serve(&server, "weights").unwrap();
    assert_eq!(
        Handle::receive(&client).unwrap().map().unwrap().as_slice(),
        &data[..]
    );

    // A peer that connected and vanished is not, whatever its pid now shows.
    let pid = connect_and_vanish(&socket);
    let (server, _) = listener.accept().unwrap();
    in_tenant(pid);
    match pool.serve(&server, "weights") {
        Err(MemError::Refused(reason)) => {
            assert!(
                reason.contains(&format!("peer pid {pid} exited")),
                "{reason}"
            )
        }
        other => panic!("a vanished peer was not refused: {other:?}"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_shared_chunk_is_as_hot_as_its_hottest_holder() {
    let page = sys::page_size() as u64;
    let mut pool = Pool::new(
        me(),
        PoolOptions {
            same_behaviour: true,
        },
    )
    .unwrap();
    // "cold" shares page 1 with "hot"; "old" and "cold" also hold pages of their own.
    let hot = pages(&[1, 2]);
    let _ = pool.insert("cold", &pages(&[1, 10])).unwrap();
    let _ = pool.insert("old", &pages(&[20, 21])).unwrap();
    let _ = pool.insert("hot", &hot).unwrap();
    pool.touch("hot").unwrap();
    assert_eq!(pool.stats().pooled_bytes, 5 * page);
    // A budget of three pages: FIFO by chunk age would drop page 1 (inserted first, by
    // "cold"); the pool drops "cold" and "old" and keeps page 1 because "hot" uses it. Page 1
    // keeps its two-page segment alive (sealed segments are freed whole), which the stats
    // show as pinned.
    let evicted = pool.evict_to(3 * page);
    assert_eq!(evicted, vec!["cold".to_string(), "old".to_string()]);
    let stats = pool.stats();
    assert_eq!(stats.pooled_bytes, 2 * page);
    assert_eq!(stats.pinned_bytes, page);
    assert_eq!(pool.map("hot").unwrap().as_slice(), &hot[..]);
    // Page 1 is still found by content.
    let _ = pool.insert("again", &pages(&[1])).unwrap();
    assert_eq!(pool.stats().pooled_bytes, 2 * page);
    // Down to nothing, everything goes, least recently used first.
    assert_eq!(
        pool.evict_to(0),
        vec!["hot".to_string(), "again".to_string()]
    );
    assert_eq!(
        pool.stats(),
        kfuse_mem::pool::PoolStats {
            domain: me().to_string(),
            ..Default::default()
        }
    );
}
