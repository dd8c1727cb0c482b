//! Provider outages as the shared handle sees them: a transient failure counted against its
//! provider, an outage announced and probed for in the background until the provider
//! answers again, and the keys cooled before it was seen brought back to wait it out.

use std::time::Duration;

use tokio::time::Instant;

use super::{App, Event};
use crate::health::{HealthEvent, Reason, StateKind};
use crate::outage::{OutageChange, OutagePolicy, Outages};
use crate::pool::{KeyEntry, KeyPool};
use crate::provider::Provider;

/// How soon keyrelay asks a provider that went down, itself, whether it answers again (a
/// `getbalance` with one of its keys); doubling after each silence, up to
/// [`PROVIDER_PROBE_MAX`]. Without it a provider would be back only when its cooldown ran
/// out or the next refresh came, however soon it recovered.
const PROVIDER_PROBE_FIRST: Duration = Duration::from_secs(1);
const PROVIDER_PROBE_MAX: Duration = Duration::from_secs(30);

impl App {
    /// Counts a transient failure of `key` (a transport failure, 5xx or server error)
    /// against its provider, and says whether the provider is down now: then the failure
    /// is the provider's, and must not count against the key as well. The keys that
    /// transient failures cooled before the outage was seen were its first casualties, not
    /// faulty themselves: they come back, to wait out the outage with their provider.
    ///
    /// A pool of one provider has nowhere else to send its tasks: the outage is recorded
    /// (for `keyrelay_provider_up` and `/status`), but its keys are judged one by one as
    /// before, so the ejection cap still keeps part of the pool trying.
    pub fn provider_failed(&self, pool: &KeyPool, key: &KeyEntry, jitter: f64) -> bool {
        let alone = pool.providers().nth(1).is_none();
        let now = Instant::now();
        let failover = &self.snapshot().config.failover;
        let policy = OutagePolicy {
            threshold: failover.transient_failures,
            cooldown: failover.transient_cooldown,
            max_cooldown: failover.transient_cooldown_max,
            jitter,
        };
        let keys = pool.keys_of(key.provider);
        let change = self
            .0
            .outages
            .failed(key.provider, key.id, keys, &policy, now);
        if let Some(OutageChange::Down { until }) = change {
            let provider = key.provider.name();
            let back_in = until.saturating_duration_since(now);
            tracing::warn!(
                provider,
                ?back_in,
                "provider down: its keys take no new task while another provider's can"
            );
            self.0
                .metrics
                .provider_outages
                .with_label_values(&[provider])
                .inc();
            self.emit(|| Event::Provider {
                provider: key.provider,
                up: false,
            });
            self.probe_provider(key.provider);
            if alone {
                return false;
            }
            for other in pool.keys().iter().filter(|k| k.provider == key.provider) {
                let view = pool.health(other, now);
                if view.state == StateKind::Cooling && view.reason == Some(Reason::Transient) {
                    self.record_health(other, HealthEvent::Restore);
                }
            }
            return true;
        }
        !alone && self.0.outages.is_down(key.provider, now)
    }

    /// Asks a provider that went down whether it answers again, in the background, until
    /// it does, it is back by other means, or no key of it is left to ask with. One probe
    /// per provider at a time; a key the operator disabled is never used for it.
    fn probe_provider(&self, provider: Provider) {
        use std::sync::atomic::Ordering;
        let bit = 1u8 << (provider as u8);
        if self.0.probing.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
            return;
        }
        let app = self.clone();
        tokio::spawn(async move {
            let mut delay = PROVIDER_PROBE_FIRST;
            let mut recovered = false;
            loop {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(PROVIDER_PROBE_MAX);
                if !app.0.outages.view(provider, Instant::now()).out {
                    recovered = true;
                    break;
                }
                // Paused after an IP ban: any request would extend the ban.
                if app.upstream_paused().is_some() {
                    continue;
                }
                let snapshot = app.snapshot();
                let pool = &snapshot.pool;
                let Some(key) = pool.askable().find(|k| k.provider == provider) else {
                    break;
                };
                let timeout = snapshot.config.timeouts.refresh;
                match app.client().read_balance(key.account(), timeout).await {
                    Err(crate::failover::ReadError::Unavailable) => {}
                    answer => {
                        if let Ok(balance) = answer {
                            key.stats.set_balance(Some(balance));
                        }
                        app.provider_answered(provider);
                        recovered = true;
                        break;
                    }
                }
            }
            app.0.probing.fetch_and(!bit, Ordering::AcqRel);
            // A new outage that began while this probe was ending found the bit still set
            // and started no probe of its own.
            if recovered && app.0.outages.view(provider, Instant::now()).out {
                app.probe_provider(provider);
            }
        });
    }

    /// `provider` answered: an outage of it, if there was one, is over.
    pub fn provider_answered(&self, provider: Provider) {
        if let Some(OutageChange::Up) = self.0.outages.answered(provider, Instant::now()) {
            tracing::info!(provider = provider.name(), "provider answers again");
            self.emit(|| Event::Provider { provider, up: true });
        }
    }

    /// Which providers are down.
    pub fn outages(&self) -> &Outages {
        &self.0.outages
    }
}
