//! Interrupting an operation in the middle of its work: its `maxTimeMS` deadline, and `killOp`.
//!
//! Owns: the interrupt state of the operation being polled on this thread, and the check that
//! long loops call (scans, blocking stages, `$map` / `$reduce` / `$range`). The state is set
//! for the length of each poll of the operation's future ([`Interruptible`]) and restored after
//! it, so it follows the operation across threads and never leaks to another task on the same
//! thread; synchronous work within a poll sees it. The clock is read at most once every
//! [`CHECK_EVERY`] checks, so a check in a per-document loop costs a counter increment.
//!
//! Invariants: outside an [`Interruptible`] poll nothing is ever interrupted; once an
//! operation's deadline has passed or it was killed, every later check in it fails, with
//! `MaxTimeMSExpired` (50) or `Interrupted` (11601) as MongoDB's.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use wire::{ErrorCode, MongoError, Result};

/// How many checks pass between two reads of the clock.
pub const CHECK_EVERY: u32 = 64;

/// What can end an operation early.
#[derive(Debug, Clone, Default)]
pub struct Interrupt {
    /// When its `maxTimeMS` runs out.
    pub deadline: Option<Instant>,
    /// Set by `killOp` (and session kills).
    pub killed: Option<Arc<AtomicBool>>,
}

impl Interrupt {
    pub fn deadline(deadline: Option<Instant>) -> Interrupt {
        Interrupt {
            deadline,
            killed: None,
        }
    }

    fn is_set(&self) -> bool {
        self.deadline.is_some() || self.killed.is_some()
    }

    /// The error of an operation that must stop now, if it must.
    pub fn status(&self, now: Instant) -> Result<()> {
        if self
            .killed
            .as_ref()
            .is_some_and(|k| k.load(Ordering::Relaxed))
        {
            return Err(MongoError::new(
                ErrorCode::INTERRUPTED,
                "operation was interrupted",
            ));
        }
        if self.deadline.is_some_and(|d| now >= d) {
            return Err(max_time_expired());
        }
        Ok(())
    }
}

/// `MaxTimeMSExpired`, as MongoDB words it.
pub fn max_time_expired() -> MongoError {
    MongoError::new(
        ErrorCode::MAX_TIME_MS_EXPIRED,
        "operation exceeded time limit",
    )
}

thread_local! {
    static CURRENT: std::cell::RefCell<Interrupt> = std::cell::RefCell::new(Interrupt::default());
    static COUNTER: Cell<u32> = const { Cell::new(0) };
}

/// Fails when the operation being run on this thread must stop (its deadline passed, or it was
/// killed). Cheap enough for every document of a scan.
pub fn check() -> Result<()> {
    let n = COUNTER.with(|c| {
        let n = c.get().wrapping_add(1);
        c.set(n);
        n
    });
    if !n.is_multiple_of(CHECK_EVERY) {
        return Ok(());
    }
    check_now()
}

/// [`check`] reading the clock now (before or after a step that may take long).
pub fn check_now() -> Result<()> {
    CURRENT.with(|c| {
        let current = c.borrow();
        if !current.is_set() {
            return Ok(());
        }
        current.status(Instant::now())
    })
}

/// The operation being run on this thread (nothing to interrupt outside an [`Interruptible`]),
/// for work it hands to another thread.
pub fn current() -> Interrupt {
    CURRENT.with(|c| c.borrow().clone())
}

/// Runs `f` with `interrupt` as this thread's operation, restoring the one before.
pub fn with<T>(interrupt: &Interrupt, f: impl FnOnce() -> T) -> T {
    let before = CURRENT.with(|c| c.replace(interrupt.clone()));
    let out = f();
    CURRENT.with(|c| *c.borrow_mut() = before);
    out
}

/// A future whose every poll runs as an interruptible operation.
pub struct Interruptible<F> {
    interrupt: Interrupt,
    future: Pin<Box<F>>,
}

impl<F: Future> Interruptible<F> {
    pub fn new(interrupt: Interrupt, future: F) -> Interruptible<F> {
        Interruptible {
            interrupt,
            future: Box::pin(future),
        }
    }
}

impl<F: Future> Future for Interruptible<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let future = this.future.as_mut();
        with(&this.interrupt, || future.poll(cx))
    }
}

/// `maxTimeMS` of a command: `None` when absent or 0 (no limit). A value that is not a
/// non-negative integral number within int32 is `BadValue`, as MongoDB's parser words it.
pub fn max_time_ms(cmd: &bson::Document) -> Result<Option<u64>> {
    use bson::Bson;
    let Some(v) = cmd.get("maxTimeMS") else {
        return Ok(None);
    };
    let n = match v {
        Bson::Int32(i) => f64::from(*i),
        Bson::Int64(i) => *i as f64,
        Bson::Double(d) => *d,
        Bson::Decimal128(d) => crate::value::decimal_to_f64(d),
        _ => return Err(MongoError::bad_value("maxTimeMS must be a number")),
    };
    if !(0.0..=f64::from(i32::MAX)).contains(&n) {
        return Err(MongoError::bad_value(format!(
            "{n} value for maxTimeMS is out of range"
        )));
    }
    if n.fract() != 0.0 {
        return Err(MongoError::bad_value("maxTimeMS has non-integral value"));
    }
    // In range and integral: the cast is exact.
    Ok(Some(n as u64).filter(|ms| *ms > 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use std::time::Duration;

    #[test]
    fn nothing_is_interrupted_outside_an_operation() {
        for _ in 0..CHECK_EVERY * 2 {
            assert!(check().is_ok());
        }
    }

    #[test]
    fn a_passed_deadline_fails_every_check_within_a_clock_read() {
        let past = Interrupt::deadline(Some(Instant::now()));
        with(&past, || {
            let failed = (0..CHECK_EVERY).filter(|_| check().is_err()).count();
            assert_eq!(
                failed, 1,
                "the clock is read once every {CHECK_EVERY} checks"
            );
            assert_eq!(check_now().map_err(|e| e.code), Err(50));
        });
        assert!(check_now().is_ok(), "restored after the operation");
        let later = Interrupt::deadline(Some(Instant::now() + Duration::from_secs(60)));
        with(&later, || assert!(check_now().is_ok()));
    }

    #[test]
    fn a_killed_operation_is_interrupted() {
        let killed = Arc::new(AtomicBool::new(false));
        let op = Interrupt {
            deadline: None,
            killed: Some(killed.clone()),
        };
        with(&op, || assert!(check_now().is_ok()));
        killed.store(true, Ordering::Relaxed);
        with(&op, || {
            assert_eq!(check_now().map_err(|e| e.code), Err(11601))
        });
    }

    #[test]
    fn max_time_ms_is_parsed_as_mongodb_parses_it() {
        assert_eq!(max_time_ms(&doc! {}).unwrap(), None);
        assert_eq!(max_time_ms(&doc! {"maxTimeMS": 0}).unwrap(), None);
        assert_eq!(max_time_ms(&doc! {"maxTimeMS": 5_i64}).unwrap(), Some(5));
        assert_eq!(max_time_ms(&doc! {"maxTimeMS": 5.0}).unwrap(), Some(5));
        for bad in [
            doc! {"maxTimeMS": -1},
            doc! {"maxTimeMS": 2.5},
            doc! {"maxTimeMS": "1"},
            doc! {"maxTimeMS": i64::MAX},
            doc! {"maxTimeMS": f64::NAN},
        ] {
            assert_eq!(max_time_ms(&bad).map_err(|e| e.code), Err(2), "{bad}");
        }
    }
}
