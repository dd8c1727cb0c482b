//! The signals that size a worker fleet: the pool's threads, queue and balance, and how many
//! workers they call for. Pure: `pool` gathers the figures, `/scaling` and the metrics show
//! them, and `docs/prometheus/alerts.yml` records the same formula as
//! `keyrelay:workers_wanted:instant` (`docs/scaling.md`).

use serde::Serialize;

/// The pool's figures an autoscaler reads, over the keys in rotation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolFigures {
    /// Threads of the keys in rotation: the ceiling on tasks solving at once.
    pub threads_total: u64,
    /// Of those, threads held by tasks (never more than `threads_total`).
    pub threads_in_use: u64,
    /// Submits waiting for a thread.
    pub queued: u64,
    /// The keys' total balance; `None` while any key in rotation has no known balance,
    /// because a partial sum would read as a low balance and brake for no reason.
    pub balance_total: Option<f64>,
}

/// The `GET /scaling` answer: the figures and the recommendation drawn from them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Scaling {
    pub threads_total: u64,
    pub threads_in_use: u64,
    pub threads_free: u64,
    pub queued: u64,
    pub balance_total: Option<f64>,
    /// The balance is known and below `[scaling] brake_balance`.
    pub brake: bool,
    pub workers_wanted: u64,
}

/// The recommendation for `figures` with the brake at `brake_balance`.
///
/// A worker holds one thread while its task solves, so the workers the pool can use are
/// those solving now plus those whose submits wait: `in_use + queued`. A queue forms only
/// while every key in rotation is full, so it grows the figure only while the threads are
/// busy. It never goes above the threads in rotation (free plus in use): more workers than
/// threads bring only waiting. Under the brake no new worker is wanted: the figure is the
/// workers solving now, so the fleet shrinks to them and spends no more than it does.
pub fn recommend(figures: PoolFigures, brake_balance: f64) -> Scaling {
    let PoolFigures {
        threads_total,
        queued,
        balance_total,
        ..
    } = figures;
    let threads_in_use = figures.threads_in_use.min(threads_total);
    let brake = balance_total.is_some_and(|balance| balance < brake_balance);
    let workers_wanted = if brake {
        threads_in_use
    } else {
        threads_in_use.saturating_add(queued).min(threads_total)
    };
    Scaling {
        threads_total,
        threads_in_use,
        threads_free: threads_total - threads_in_use,
        queued,
        balance_total,
        brake,
        workers_wanted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(total: u64, in_use: u64, queued: u64, balance: Option<f64>) -> PoolFigures {
        PoolFigures {
            threads_total: total,
            threads_in_use: in_use,
            queued,
            balance_total: balance,
        }
    }

    #[test]
    fn a_busy_pool_with_a_queue_wants_its_solvers_and_its_waiters_up_to_the_threads() {
        let busy = recommend(figures(10, 10, 3, Some(50.0)), 5.0);
        assert_eq!(busy.workers_wanted, 10, "capped at the threads in rotation");
        assert_eq!(busy.threads_free, 0);
        assert!(!busy.brake);
        let room = recommend(figures(10, 6, 3, Some(50.0)), 5.0);
        assert_eq!(room.workers_wanted, 9);
        assert_eq!(room.threads_free, 4);
    }

    #[test]
    fn an_idle_pool_wants_none() {
        let idle = recommend(figures(10, 0, 0, Some(50.0)), 5.0);
        assert_eq!((idle.workers_wanted, idle.threads_free), (0, 10));
    }

    #[test]
    fn fewer_threads_in_rotation_lower_the_ceiling() {
        // A key of 4 threads benched: 6 left, and the queue cannot buy more.
        let benched = recommend(figures(6, 6, 8, Some(50.0)), 5.0);
        assert_eq!(benched.workers_wanted, 6);
        // No key in rotation: nothing to work with, however long the queue.
        assert_eq!(recommend(figures(0, 0, 8, None), 5.0).workers_wanted, 0);
    }

    #[test]
    fn the_brake_wants_only_the_workers_solving_now() {
        let braked = recommend(figures(10, 4, 6, Some(4.99)), 5.0);
        assert!(braked.brake);
        assert_eq!(braked.workers_wanted, 4);
        // At the threshold exactly, the brake is off: it engages below it.
        let at = recommend(figures(10, 4, 6, Some(5.0)), 5.0);
        assert!(!at.brake);
        assert_eq!(at.workers_wanted, 10);
    }

    #[test]
    fn an_unknown_balance_never_brakes_and_a_zero_threshold_never_does() {
        let unknown = recommend(figures(10, 4, 2, None), 5.0);
        assert!(!unknown.brake);
        assert_eq!(unknown.workers_wanted, 6);
        assert!(!recommend(figures(10, 4, 2, Some(0.0)), 0.0).brake);
    }

    #[test]
    fn threads_in_use_beyond_the_threads_count_as_all_of_them() {
        // A key's threadsinfo can lag its lowered capacity for a refresh.
        let over = recommend(figures(4, 7, 0, None), 0.0);
        assert_eq!((over.threads_in_use, over.threads_free), (4, 0));
        assert_eq!(over.workers_wanted, 4);
    }
}
