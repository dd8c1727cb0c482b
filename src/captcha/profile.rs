//! What each provider's answers mean for a key, as data: one profile per provider over the
//! shared outcome table of `reply`. The same code can mean different things at different
//! services (`ERROR_ZERO_BALANCE` is "all threads busy, or no plan" at CaptchaAI, whose
//! plans are sold by threads, and "no money" at the pay-per-task services), and only
//! CaptchaAI answers `threadsinfo`. `docs/providers.md` renders this table; a test keeps
//! the two the same.

use std::time::Duration;

use super::reply::{classify, Outcome, Reply};
use crate::provider::Provider;

/// What `ERROR_ZERO_BALANCE` means at a provider, and so which read of keyrelay's own
/// settles it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroBalance {
    /// "No free thread": every thread busy (a short cooldown), or no plan at all (benched);
    /// `threadsinfo` tells the two apart.
    Threads,
    /// "No money": a `getbalance` at or below `failover.min_balance` benches the key until
    /// a refresh reads a balance above it again.
    Funds,
}

/// The currency a provider's `getbalance` answers in: balances add up only within one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Currency {
    Usd,
    Rub,
}

impl Currency {
    pub const fn code(self) -> &'static str {
        match self {
            Currency::Usd => "USD",
            Currency::Rub => "RUB",
        }
    }
}

/// One provider's meanings.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub provider: Provider,
    pub zero_balance: ZeroBalance,
    /// Whether the provider answers `res.php?action=threadsinfo`. Elsewhere a key's threads
    /// are its configured `threads`, or unlimited.
    pub threadsinfo: bool,
    /// Codes whose outcome here differs from the shared table, with that outcome.
    pub codes: &'static [(&'static str, Outcome)],
    /// `method` values the provider is known not to serve: a submit of one skips its keys
    /// rather than failing on them. Only what is known goes here; an unlisted method is
    /// tried.
    pub unserved: &'static [&'static str],
    pub currency: Currency,
    /// How long after a submit the provider advises the first poll.
    pub first_poll: PollAdvice,
    /// What this profile is unsure of; the behaviour there is the tolerant one.
    pub uncertain: &'static str,
}

/// The first poll's delay a provider advises, by kind of task: an image is read in
/// seconds, a token (reCAPTCHA, Turnstile, GeeTest…) takes a browser's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollAdvice {
    pub image: Duration,
    pub token: Duration,
}

/// Every service's docs and SDKs say the same: about 5 s for an image, 15 s for a token
/// (CaptchaAI's examples, 2captcha's and rucaptcha's API references).
const ADVISED_FIRST_POLL: PollAdvice = PollAdvice {
    image: Duration::from_secs(5),
    token: Duration::from_secs(15),
};

/// The `in.php` methods whose task is an image (or a text question) a worker reads at a
/// glance; every other method is a token task.
const IMAGE_METHODS: &[&str] = &[
    "base64",
    "post",
    "textcaptcha",
    "bls",
    "grid",
    "canvas",
    "coordinates",
    "rotatecaptcha",
];

/// Image types CaptchaAI documents as its own (BLS grids, Cloudflare's challenge page):
/// 2captcha's `in.php` reference lists no such methods.
const CAPTCHAAI_ONLY: &[&str] = &["bls", "cloudflare_challenge"];

const PROFILES: [Profile; 5] = [
    Profile {
        provider: Provider::CaptchaAi,
        zero_balance: ZeroBalance::Threads,
        threadsinfo: true,
        codes: &[],
        unserved: &[],
        currency: Currency::Usd,
        first_poll: ADVISED_FIRST_POLL,
        uncertain: "",
    },
    Profile {
        provider: Provider::TwoCaptcha,
        zero_balance: ZeroBalance::Funds,
        threadsinfo: false,
        codes: &[],
        unserved: CAPTCHAAI_ONLY,
        currency: Currency::Usd,
        first_poll: ADVISED_FIRST_POLL,
        uncertain: "",
    },
    Profile {
        provider: Provider::RuCaptcha,
        zero_balance: ZeroBalance::Funds,
        threadsinfo: false,
        codes: &[],
        unserved: CAPTCHAAI_ONLY,
        currency: Currency::Rub,
        first_poll: ADVISED_FIRST_POLL,
        uncertain: "",
    },
    Profile {
        provider: Provider::CapMonster,
        zero_balance: ZeroBalance::Funds,
        threadsinfo: false,
        codes: &[],
        unserved: CAPTCHAAI_ONLY,
        currency: Currency::Usd,
        first_poll: ADVISED_FIRST_POLL,
        uncertain: "which methods its 2captcha-compatible mode serves beyond images, reCAPTCHA, Turnstile and GeeTest; unlisted methods are tried",
    },
    Profile {
        provider: Provider::SolveCaptcha,
        zero_balance: ZeroBalance::Funds,
        threadsinfo: false,
        codes: &[],
        unserved: CAPTCHAAI_ONLY,
        currency: Currency::Usd,
        first_poll: ADVISED_FIRST_POLL,
        uncertain: "the meaning of its rarer error codes, read as 2captcha's",
    },
];

impl Profile {
    /// The profile of `provider`.
    pub fn of(provider: Provider) -> &'static Profile {
        PROFILES
            .iter()
            .find(|p| p.provider == provider)
            .expect("every provider has a profile")
    }

    /// Every profile, in `Provider::ALL`'s order.
    pub fn all() -> &'static [Profile] {
        &PROFILES
    }

    /// [`classify`], with this provider's own meanings over the shared table.
    pub fn classify(&self, http_status: u16, reply: &Reply) -> Outcome {
        let shared = classify(http_status, reply);
        match reply {
            Reply::Error(code) if (200..=299).contains(&http_status) => self
                .codes
                .iter()
                .find(|(known, _)| *known == code.as_str())
                .map_or(shared, |(_, outcome)| *outcome),
            _ => shared,
        }
    }

    /// How long after a submit of `method` to poll first, as the provider advises.
    pub fn first_poll(&self, method: &str) -> Duration {
        let method = method.trim();
        let image = method.is_empty()
            || IMAGE_METHODS
                .iter()
                .any(|image| image.eq_ignore_ascii_case(method));
        if image {
            self.first_poll.image
        } else {
            self.first_poll.token
        }
    }

    /// Whether a submit of `method` may go to this provider's keys. Method names are
    /// compared without case, as the services read them.
    pub fn serves(&self, method: &str) -> bool {
        !self
            .unserved
            .iter()
            .any(|unserved| unserved.eq_ignore_ascii_case(method.trim()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(code: &str) -> Reply {
        Reply::Error(code.to_owned())
    }

    #[test]
    fn every_provider_has_one_profile_in_the_order_of_all() {
        let providers: Vec<Provider> = Profile::all().iter().map(|p| p.provider).collect();
        assert_eq!(providers, Provider::ALL);
        for provider in Provider::ALL {
            assert_eq!(Profile::of(provider).provider, provider);
        }
    }

    #[test]
    fn captchaai_reads_zero_balance_as_threads_and_answers_threadsinfo() {
        let p = Profile::of(Provider::CaptchaAi);
        assert_eq!(p.zero_balance, ZeroBalance::Threads);
        assert!(p.threadsinfo);
        assert_eq!(p.currency, Currency::Usd);
        assert!(p.uncertain.is_empty());
    }

    #[test]
    fn the_pay_per_task_services_read_zero_balance_as_money_and_have_no_threadsinfo() {
        for provider in [
            Provider::TwoCaptcha,
            Provider::RuCaptcha,
            Provider::CapMonster,
            Provider::SolveCaptcha,
        ] {
            let p = Profile::of(provider);
            assert_eq!(p.zero_balance, ZeroBalance::Funds, "{provider}");
            assert!(!p.threadsinfo, "{provider}");
        }
    }

    #[test]
    fn rucaptcha_alone_answers_in_roubles() {
        for p in Profile::all() {
            let expected = if p.provider == Provider::RuCaptcha {
                Currency::Rub
            } else {
                Currency::Usd
            };
            assert_eq!(p.currency, expected, "{}", p.provider);
        }
        assert_eq!(Currency::Rub.code(), "RUB");
        assert_eq!(Currency::Usd.code(), "USD");
    }

    #[test]
    fn every_profile_classifies_the_shared_codes_as_the_shared_table_does() {
        for p in Profile::all() {
            for (status, reply) in [
                (200, error("ERROR_ZERO_BALANCE")),
                (200, error("ERROR_KEY_DOES_NOT_EXIST")),
                (200, error("ERROR_NO_SLOT_AVAILABLE")),
                (200, error("IP_BANNED")),
                (200, error("ERROR_CAPTCHA_UNSOLVABLE")),
                (200, error("SOMETHING_NEW")),
                (200, Reply::Ok("123".to_owned())),
                (200, Reply::NotReady),
                (200, Reply::Garbage),
                (429, Reply::Garbage),
                (503, error("ERROR_ZERO_BALANCE")),
            ] {
                let overridden = match &reply {
                    Reply::Error(code) => p.codes.iter().any(|(c, _)| c == code),
                    _ => false,
                };
                if !overridden {
                    assert_eq!(
                        p.classify(status, &reply),
                        classify(status, &reply),
                        "{} {status} {reply:?}",
                        p.provider
                    );
                }
            }
        }
    }

    #[test]
    fn a_profiles_own_code_overrides_the_shared_meaning_only_on_a_2xx() {
        let p = Profile {
            codes: &[("ERROR_ZERO_BALANCE", Outcome::KeyFull)],
            ..Profile::of(Provider::TwoCaptcha).clone()
        };
        let zero = error("ERROR_ZERO_BALANCE");
        assert_eq!(p.classify(200, &zero), Outcome::KeyFull);
        assert_eq!(p.classify(502, &zero), Outcome::Transient);
        assert_eq!(p.classify(429, &zero), Outcome::KeyFull);
        assert_eq!(
            p.classify(200, &error("ERROR_KEY_DOES_NOT_EXIST")),
            Outcome::KeyUnusable
        );
    }

    #[test]
    fn captchaais_own_methods_are_not_sent_elsewhere_and_everything_else_is_tried() {
        let captchaai = Profile::of(Provider::CaptchaAi);
        for method in [
            "bls",
            "cloudflare_challenge",
            "userrecaptcha",
            "base64",
            "hcaptcha",
        ] {
            assert!(captchaai.serves(method), "{method}");
        }
        for provider in [
            Provider::TwoCaptcha,
            Provider::RuCaptcha,
            Provider::CapMonster,
            Provider::SolveCaptcha,
        ] {
            let p = Profile::of(provider);
            for method in ["bls", "BLS", " cloudflare_challenge "] {
                assert!(!p.serves(method), "{provider} {method}");
            }
            for method in [
                "userrecaptcha",
                "base64",
                "post",
                "turnstile",
                "",
                "unknown",
            ] {
                assert!(p.serves(method), "{provider} {method}");
            }
        }
    }

    #[test]
    fn the_first_poll_waits_5s_for_an_image_and_15s_for_a_token_at_every_provider() {
        for p in Profile::all() {
            for image in ["base64", "post", "POST", " textcaptcha ", "bls", "grid", ""] {
                assert_eq!(p.first_poll(image), Duration::from_secs(5), "{image}");
            }
            for token in [
                "userrecaptcha",
                "turnstile",
                "hcaptcha",
                "geetest",
                "funcaptcha",
                "unknown",
            ] {
                assert_eq!(p.first_poll(token), Duration::from_secs(15), "{token}");
            }
        }
    }

    /// The profile table of docs/providers.md, row by row as its cells read.
    fn doc_rows() -> Vec<Vec<String>> {
        let doc = include_str!("../../docs/providers.md");
        doc.lines()
            .skip_while(|l| !l.starts_with("| provider |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|row| {
                row.trim_matches('|')
                    .split(" | ")
                    .map(|cell| cell.trim().to_owned())
                    .collect()
            })
            .collect()
    }

    /// A profile as its docs row says it.
    fn row_of(p: &Profile) -> Vec<String> {
        let code = |s: &str| format!("`{s}`");
        let unserved = if p.unserved.is_empty() {
            "none".to_owned()
        } else {
            p.unserved
                .iter()
                .map(|m| code(m))
                .collect::<Vec<_>>()
                .join(", ")
        };
        vec![
            code(p.provider.name()),
            code(p.provider.default_upstream()),
            match p.zero_balance {
                ZeroBalance::Threads => "no free thread, or no plan",
                ZeroBalance::Funds => "no money",
            }
            .to_owned(),
            if p.threadsinfo { "yes" } else { "no" }.to_owned(),
            unserved,
            p.currency.code().to_owned(),
            if p.uncertain.is_empty() {
                "—".to_owned()
            } else {
                p.uncertain.to_owned()
            },
        ]
    }

    #[test]
    fn docs_providers_md_renders_every_profile_as_it_is() {
        let rows = doc_rows();
        let expected: Vec<Vec<String>> = Profile::all().iter().map(row_of).collect();
        assert_eq!(rows, expected);
    }
}
