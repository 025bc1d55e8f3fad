//! The thread pool kernels run on.
//!
//! Workers spin for a while after each job before parking, as OpenMP runtimes do: waking a
//! parked thread can take a scheduler tick (4 ms on the machines kfuse is benchmarked on), longer
//! than a whole memory-bound kernel. Tasks are claimed dynamically and the calling thread claims
//! them too, so a worker that wakes late never delays a launch: the caller simply does more of
//! the work. Every claim is tagged with the job's generation, so a worker that wakes after its
//! job finished cannot touch it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_millis(20);

type Job = dyn Fn(usize) + Sync;

struct Shared {
    /// Generation (high 32 bits) and next unclaimed task (low 32 bits).
    claim: AtomicU64,
    /// Tasks of the current generation.
    tasks: AtomicUsize,
    /// Tasks of the current generation finished.
    done: AtomicUsize,
    /// The current job, valid while a claimed task of its generation is unfinished.
    job: Mutex<Option<*const Job>>,
    wake: Condvar,
}

// SAFETY: the job pointer is only dereferenced by a thread holding an unfinished claim of the
// job's generation, and `run` does not return (so the job outlives every such use) until every
// task is done.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// A fixed set of worker threads plus the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
    /// Serializes jobs: one launch at a time uses the workers.
    launch: Mutex<()>,
}

impl Pool {
    /// A pool using `threads` threads in all (the caller and `threads - 1` workers).
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(0),
            tasks: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            job: Mutex::new(None),
            wake: Condvar::new(),
        });
        for _ in 1..threads.max(1) {
            let s = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("kfuse-worker".into())
                .spawn(move || worker(&s))
                .expect("spawn a kfuse worker");
        }
        Pool {
            shared,
            threads: threads.max(1),
            launch: Mutex::new(()),
        }
    }

    /// The process-wide pool: `KFUSE_THREADS` threads, else one per available core. A
    /// `KFUSE_THREADS` that is not a whole number from 1 up is reported on standard error and
    /// the default taken (the `kfuse` binary refuses it before anything runs, with
    /// [`threads_from_env`]).
    pub fn global() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let threads = match threads_from_env() {
                Ok(threads) => threads.unwrap_or(cores),
                Err(e) => {
                    eprintln!("kfuse: {e}; using {cores} threads");
                    cores
                }
            };
            Pool::new(threads)
        })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Calls `job(i)` for every `i` in `0..tasks`, spread over the pool; returns when all are
    /// done.
    pub fn run(&self, tasks: usize, job: &(dyn Fn(usize) + Sync)) {
        if tasks == 0 {
            return;
        }
        if self.threads == 1 || tasks == 1 {
            (0..tasks).for_each(job);
            return;
        }
        let _one_at_a_time = self.launch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &self.shared;
        // SAFETY (lifetime extension): `job` is used only while this call waits below.
        let ptr: *const Job =
            unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Job>(job) };
        // Publish under the lock parked workers check, so that no wake-up is lost.
        let generation = {
            let mut installed = s.job.lock().unwrap_or_else(|e| e.into_inner());
            *installed = Some(ptr);
            s.tasks.store(tasks, Ordering::Relaxed);
            s.done.store(0, Ordering::Relaxed);
            let generation = (s.claim.load(Ordering::Relaxed) >> 32).wrapping_add(1) & 0xffff_ffff;
            s.claim.store(generation << 32, Ordering::Release);
            generation
        };
        s.wake.notify_all();
        while let Some(i) = claim(s, generation, tasks) {
            job(i);
            s.done.fetch_add(1, Ordering::AcqRel);
        }
        while s.done.load(Ordering::Acquire) < tasks {
            std::hint::spin_loop();
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Claims the next task of `generation`, if any is left.
fn claim(s: &Shared, generation: u64, tasks: usize) -> Option<usize> {
    let mut current = s.claim.load(Ordering::Acquire);
    loop {
        let (g, next) = (current >> 32, (current & 0xffff_ffff) as usize);
        if g != generation || next >= tasks {
            return None;
        }
        match s.claim.compare_exchange_weak(
            current,
            current + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Some(next),
            Err(actual) => current = actual,
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Spin, then park, until a new generation appears.
        let start = Instant::now();
        let mut generation = s.claim.load(Ordering::Acquire) >> 32;
        let mut spins = 0u32;
        while generation == seen {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
                let guard = s.job.lock().unwrap_or_else(|e| e.into_inner());
                generation = s.claim.load(Ordering::Acquire) >> 32;
                if generation == seen {
                    let _parked = s
                        .wake
                        .wait_timeout(guard, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner());
                }
            }
            generation = s.claim.load(Ordering::Acquire) >> 32;
        }
        seen = generation;
        let tasks = s.tasks.load(Ordering::Acquire);
        while let Some(i) = claim(s, generation, tasks) {
            // Holding an unfinished claim of this generation keeps the job alive (see `run`).
            let job = s
                .job
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .expect("a claimed job is installed");
            // SAFETY: see `Shared`.
            unsafe { (*job)(i) };
            s.done.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The thread count `KFUSE_THREADS` asks for: `None` where it is unset or empty, an error
/// naming the value where it is not a whole number from 1 to 1024.
pub fn threads_from_env() -> Result<Option<usize>, String> {
    match std::env::var("KFUSE_THREADS") {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(format!("KFUSE_THREADS={v:?} is not a number of threads"))
        }
        Ok(v) => parse_threads(&v),
    }
}

fn parse_threads(value: &str) -> Result<Option<usize>, String> {
    if value.trim().is_empty() {
        return Ok(None);
    }
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(Some(n)),
        _ => Err(format!(
            "KFUSE_THREADS={value:?} is not a number of threads (a whole number from 1 to 1024)"
        )),
    }
}

#[cfg(test)]
mod thread_count {
    use super::parse_threads;

    #[test]
    fn only_whole_numbers_from_one_up_are_thread_counts() {
        assert_eq!(parse_threads(""), Ok(None));
        assert_eq!(parse_threads("2"), Ok(Some(2)));
        assert_eq!(parse_threads(" 16 "), Ok(Some(16)));
        for bad in ["0", "-1", "two", "1.5", "4096", "99999999999999999999999"] {
            let err = parse_threads(bad).unwrap_err();
            assert!(err.contains("KFUSE_THREADS") && err.contains(bad), "{err}");
        }
    }
}
