//! May this submit take a thread of this key: one place decides it, over the key's threads
//! here and the fleet's count, and hands out one guard, a [`Ticket`]. The service accepted
//! the submit: [`Ticket::open`] makes every write a pinned task needs (its pin, its thread
//! here, its caller token's thread, its seat in the fleet's count). Any other ending (a
//! failure, a failover, a cancelled request at any await) drops the ticket, and everything
//! it held goes back. The caller token's own cap is taken once per submit, before any key
//! is tried, and handed to the ticket that opens the task.

use std::sync::Arc;

use tokio::time::Instant;

use crate::app::App;
use crate::capacity::{Lease, SharedSeat, SharedTake};
use crate::captcha::TaskId;
use crate::pool::{FleetView, KeyEntry, KeyPool};
use crate::tokens::{Token, TokenHold, TokenId};

/// One attempt's hold on a key: its thread here and, where replicas share the pool, its
/// seat in the fleet's count.
#[must_use = "a ticket not opened for a task is given back when dropped"]
pub struct Ticket<'a> {
    local: Lease<'a>,
    seat: Option<Box<dyn SharedSeat>>,
}

/// The fleet's count after the key's own thread (`local`): a ticket, or `None` when the
/// fleet holds every thread of the key (marked so for a moment, for the walk and the queue
/// to pass it over) or cannot count now (this replica's share applies from now on). Either
/// way the local thread goes back and the walk looks again.
pub async fn seat<'a>(
    app: &App,
    pool: &KeyPool,
    key: &KeyEntry,
    local: Lease<'a>,
) -> Option<Ticket<'a>> {
    let shared = app.shared_threads();
    if !shared.counts() {
        return Some(Ticket { local, seat: None });
    }
    let limit = pool.fleet_limit(key);
    match shared.take(&key.name, limit).await {
        SharedTake::Seated(seat) => Some(Ticket {
            local,
            seat: Some(seat),
        }),
        SharedTake::Full => {
            key.stats
                .fleet
                .set_full(Some(Instant::now() + FleetView::FULL_HOLD));
            None
        }
        SharedTake::Unavailable(error) => {
            tracing::warn!(key = %key.name, error = %error, "fleet lease unavailable; this replica's share applies");
            None
        }
    }
}

impl Ticket<'_> {
    /// The service accepted the submit and answered `task`: the task is pinned to `key` for
    /// the caller `token` (with the thread it holds of the token's cap), keeps the key's
    /// thread here and its seat in the fleet's count, all before the caller has the id, so
    /// that a poll on any replica finds its key. The fleet's seat is kept after the local
    /// writes: the fleet never holds a task this replica does not.
    pub async fn open(
        self,
        app: &App,
        pool: &KeyPool,
        key: &Arc<KeyEntry>,
        task: &TaskId,
        token: Option<(&Token, TokenHold)>,
    ) {
        let now = Instant::now();
        let (token, hold) = token.unzip();
        let token_id = token.map_or(TokenId::NONE, |t| t.id);
        app.pins().pin_for(task.clone(), key.id, token_id, now);
        self.local.keep_for(task.clone(), now);
        if let Some(hold) = hold {
            app.capacity().keep_token(task.clone(), hold, now);
        }
        let token_name = token.map_or("", |t| &*t.name);
        if let Some(seat) = self.seat {
            seat.keep(task, &key.name, token_name, pool.fleet_limit(key))
                .await;
        }
    }
}
