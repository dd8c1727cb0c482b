//! The 2captcha-compatible services a key can belong to: each one's name as the config
//! spells it (`provider = "2captcha"`) and its API's own host. What each service's answers
//! mean lives in `captcha::profile`; this is only the vocabulary every layer shares.

/// A service that speaks the `in.php` / `res.php` protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Provider {
    /// CaptchaAI, `ocr.captchaai.com`: plans sold by threads. The default, so that a key
    /// without `provider` means what it always has.
    #[default]
    CaptchaAi,
    /// 2captcha, `2captcha.com`: pay per task from a balance.
    TwoCaptcha,
    /// rucaptcha, `rucaptcha.com`: 2captcha's Russian twin, balance in roubles.
    RuCaptcha,
    /// CapMonster Cloud's 2captcha-compatible mode, `api.capmonster.cloud`.
    CapMonster,
    /// SolveCaptcha, `api.solvecaptcha.com`.
    SolveCaptcha,
}

impl Provider {
    /// Every provider, in the order the docs list them.
    pub const ALL: [Provider; 5] = [
        Provider::CaptchaAi,
        Provider::TwoCaptcha,
        Provider::RuCaptcha,
        Provider::CapMonster,
        Provider::SolveCaptcha,
    ];

    /// The name the config takes and metrics and logs show.
    pub const fn name(self) -> &'static str {
        match self {
            Provider::CaptchaAi => "captchaai",
            Provider::TwoCaptcha => "2captcha",
            Provider::RuCaptcha => "rucaptcha",
            Provider::CapMonster => "capmonster",
            Provider::SolveCaptcha => "solvecaptcha",
        }
    }

    /// The provider a config names, in any case.
    pub fn from_name(name: &str) -> Option<Provider> {
        Provider::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name.trim()))
    }

    /// The base URL of the provider's API, for a key that names no `upstream` of its own.
    pub const fn default_upstream(self) -> &'static str {
        match self {
            Provider::CaptchaAi => "https://ocr.captchaai.com",
            Provider::TwoCaptcha => "https://2captcha.com",
            Provider::RuCaptcha => "https://rucaptcha.com",
            Provider::CapMonster => "https://api.capmonster.cloud",
            Provider::SolveCaptcha => "https://api.solvecaptcha.com",
        }
    }

    /// The names the config accepts, for an error message.
    pub fn names() -> String {
        Provider::ALL
            .iter()
            .map(|p| format!("\"{}\"", p.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl std::fmt::Display for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_as_its_provider_in_any_case() {
        for provider in Provider::ALL {
            assert_eq!(Provider::from_name(provider.name()), Some(provider));
            let upper = provider.name().to_ascii_uppercase();
            assert_eq!(Provider::from_name(&upper), Some(provider));
            assert_eq!(
                Provider::from_name(&format!(" {} ", provider.name())),
                Some(provider)
            );
        }
        for unknown in [
            "",
            "captcha-ai",
            "2captcha.com",
            "anticaptcha",
            "two captcha",
        ] {
            assert_eq!(Provider::from_name(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn the_default_is_captchaai_at_the_global_default_upstream() {
        assert_eq!(Provider::default(), Provider::CaptchaAi);
        assert_eq!(
            Provider::CaptchaAi.default_upstream(),
            crate::config::DEFAULT_UPSTREAM
        );
    }

    #[test]
    fn every_default_upstream_parses_and_names_the_providers_host() {
        for provider in Provider::ALL {
            let upstream = crate::config::Upstream::parse(provider.default_upstream())
                .unwrap_or_else(|e| panic!("{provider}: {e}"));
            assert!(upstream.as_str().starts_with("https://"), "{provider}");
        }
        assert_eq!(
            Provider::names(),
            "\"captchaai\", \"2captcha\", \"rucaptcha\", \"capmonster\", \"solvecaptcha\""
        );
    }
}
