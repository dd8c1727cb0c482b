//! The caller token check at the start of every API request, once `[[access.tokens]]` are
//! configured: which token a request presents, and whether it is one.
//!
//! A caller presents its token as its `key` (read as the service reads it, PHP's rules, body
//! over query), so clients stay unchanged: their "API key" is a keyrelay token. A request
//! through keyrelay as a forward proxy may keep its real API key and carry the token as its
//! proxy credential instead: `Proxy-Authorization: Basic`, the token as the password (any
//! user), or as the user with an empty password. Either one that is a token admits it.
//! (Requests inside an intercepted `CONNECT` carry no such header unless the server copies
//! the `CONNECT`'s onto them.)
//!
//! Every check goes through the wrong-token limit of the caller's address
//! ([`Denials`]): an address that used up its allowance is refused before its token is
//! read, and each wrong token it presents uses one up.

use std::net::IpAddr;
use std::sync::Arc;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use hyper::header::{HeaderMap, PROXY_AUTHORIZATION};

use crate::captcha::ParsedRequest;
use crate::metrics::Denied;
use crate::tokens::{Denials, Token, TokenTable};

/// Who is asking, for the wrong-token limit: the address the request came from, and the
/// table of recent wrong tokens by address.
#[derive(Clone, Copy)]
pub(crate) struct Asker<'a> {
    pub peer: IpAddr,
    pub denials: &'a Denials,
}

impl Asker<'_> {
    /// `check` within the limit: refused unchecked while the address is over it, and a
    /// wrong token counted against it.
    fn limited<T>(self, check: impl FnOnce() -> Result<T, Denied>) -> Result<T, Denied> {
        let wrong = |result: &Result<T, Denied>| matches!(result, Err(Denied::Wrong));
        self.denials
            .within(self.peer, check, wrong)
            .unwrap_or(Err(Denied::Limited))
    }
}

/// The token a request presents: `Ok(None)` when no tokens are configured (every caller is
/// served), `Err` with why it is refused otherwise.
pub(crate) fn check(
    tokens: &TokenTable,
    asker: Asker<'_>,
    parsed: &ParsedRequest,
    headers: &HeaderMap,
) -> Result<Option<Arc<Token>>, Denied> {
    if tokens.is_empty() {
        return Ok(None);
    }
    asker.limited(|| presented(tokens, parsed, headers).map(Some))
}

fn presented(
    tokens: &TokenTable,
    parsed: &ParsedRequest,
    headers: &HeaderMap,
) -> Result<Arc<Token>, Denied> {
    let key = parsed.param("key").filter(|k| !k.is_empty());
    if let Some(token) = key.as_deref().and_then(|k| tokens.lookup(k)) {
        return Ok(token.clone());
    }
    let proxy = headers.get(PROXY_AUTHORIZATION);
    if let Some(token) = proxy.and_then(|v| basic_token(tokens, v.as_bytes())) {
        return Ok(token.clone());
    }
    if key.is_none() && proxy.is_none() {
        Err(Denied::Missing)
    } else {
        Err(Denied::Wrong)
    }
}

/// The token in a `Basic` credential: the password, or the user when the password is empty.
fn basic_token<'a>(tokens: &'a TokenTable, value: &[u8]) -> Option<&'a Arc<Token>> {
    let (scheme, rest) = split_once(value, b' ')?;
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    let decoded = decode_base64(rest.trim_ascii())?;
    let text = std::str::from_utf8(&decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    let token = if password.is_empty() { user } else { password };
    tokens.lookup(token)
}

fn split_once(bytes: &[u8], at: u8) -> Option<(&[u8], &[u8])> {
    let i = bytes.iter().position(|&b| b == at)?;
    Some((&bytes[..i], &bytes[i + 1..]))
}

/// Standard base64 (RFC 4648 §4), padding optional: some clients leave it off.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

fn decode_base64(text: &[u8]) -> Option<Vec<u8>> {
    BASE64.decode(text).ok()
}

/// The token a request's `Proxy-Authorization: Basic` presents, for the forward proxy's
/// tunnels and relays, which carry no `key`: `Ok(None)` when no tokens are configured,
/// `Err` with why it is refused otherwise.
pub(crate) fn proxy_token(
    tokens: &TokenTable,
    asker: Asker<'_>,
    headers: &HeaderMap,
) -> Result<Option<Arc<Token>>, Denied> {
    if tokens.is_empty() {
        return Ok(None);
    }
    asker.limited(|| match headers.get(PROXY_AUTHORIZATION) {
        None => Err(Denied::Missing),
        Some(value) => basic_token(tokens, value.as_bytes())
            .cloned()
            .map(Some)
            .ok_or(Denied::Wrong),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KeyConfig, TokenConfig, Upstream};
    use crate::key_id::KeyId;
    use crate::tokens::TokenCounters;
    use crate::CallerToken;
    use bytes::Bytes;
    use hyper::header::HeaderValue;

    fn table() -> TokenTable {
        let key = KeyConfig::new(
            "a",
            "0123456789abcdef0123456789abcdef",
            Upstream::parse("http://127.0.0.1:9").unwrap(),
        );
        let token = |name: &str, value: &str| TokenConfig {
            name: name.into(),
            token: CallerToken::new(value),
            keys: None,
            tiers: None,
            max_threads: None,
            max_tunnels: crate::config::DEFAULT_MAX_TUNNELS,
            budget: None,
        };
        TokenTable::new(
            &[token("one", "token-one"), token("two", "token-two")],
            [(KeyId(0), &key)],
            &TokenCounters::default(),
        )
    }

    fn request(query: &str, body: &str, proxy: Option<&str>) -> (ParsedRequest, HeaderMap) {
        let content_type = (!body.is_empty()).then_some("application/x-www-form-urlencoded");
        let parsed =
            ParsedRequest::parse(Some(query), content_type, Bytes::from(body.to_owned())).unwrap();
        let mut headers = HeaderMap::new();
        if let Some(proxy) = proxy {
            headers.insert(PROXY_AUTHORIZATION, HeaderValue::from_str(proxy).unwrap());
        }
        (parsed, headers)
    }

    fn asker(denials: &Denials) -> Asker<'_> {
        // A fresh address per table: these tests are about reading tokens, not the limit.
        Asker {
            peer: IpAddr::from([192, 0, 2, 1]),
            denials,
        }
    }

    fn name(result: Result<Option<Arc<Token>>, Denied>) -> Result<String, Denied> {
        result.map(|t| t.expect("tokens are configured").name.to_string())
    }

    #[test]
    fn the_key_param_is_read_as_the_service_reads_it() {
        let tokens = table();
        let denials = Denials::default();
        let check = |query, body| {
            let (parsed, headers) = request(query, body, None);
            name(check(&tokens, asker(&denials), &parsed, &headers))
        };
        assert_eq!(check("key=token-one", ""), Ok("one".into()));
        // The body beats the query, as in PHP's $_REQUEST.
        assert_eq!(check("key=token-one", "key=token-two"), Ok("two".into()));
        assert_eq!(check("key=nope", "key=token-two"), Ok("two".into()));
        assert_eq!(check("key=token-two", "key=nope"), Err(Denied::Wrong));
        // Spellings PHP reads as `key`.
        assert_eq!(check("k%65y=token-one", ""), Ok("one".into()));
        assert_eq!(check("key[]=token-one", ""), Ok("one".into()));
        assert_eq!(check("method=post", ""), Err(Denied::Missing));
        assert_eq!(check("key=", ""), Err(Denied::Missing));
        assert_eq!(check("key=token-on", ""), Err(Denied::Wrong));
    }

    #[test]
    fn a_basic_proxy_credential_carries_the_token_as_password_or_user() {
        let tokens = table();
        let denials = Denials::default();
        let check = |query, proxy| {
            let (parsed, headers) = request(query, "", Some(proxy));
            name(check(&tokens, asker(&denials), &parsed, &headers))
        };
        // "anyone:token-one", "token-two:", and unpadded "x:token-one".
        assert_eq!(
            check("key=real-api-key", "Basic YW55b25lOnRva2VuLW9uZQ=="),
            Ok("one".into())
        );
        assert_eq!(check("", "basic dG9rZW4tdHdvOg=="), Ok("two".into()));
        assert_eq!(check("", "Basic eDp0b2tlbi1vbmU"), Ok("one".into()));
        // "token-one:wrong": the user is not read when a password is given.
        assert_eq!(check("", "Basic dG9rZW4tb25lOndyb25n"), Err(Denied::Wrong));
        assert_eq!(check("", "Bearer token-one"), Err(Denied::Wrong));
        assert_eq!(check("", "Basic !!!!"), Err(Denied::Wrong));
        assert_eq!(check("", "Basic"), Err(Denied::Wrong));
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_over_its_limit_is_refused_unchecked_a_valid_token_too() {
        let tokens = table();
        let denials = Denials::default();
        let (wrong, wrong_headers) = request("key=guess", "", None);
        let (right, right_headers) = request("key=token-one", "", None);
        let (_, proxy_wrong) = request("", "", Some("Basic eDpndWVzcw=="));
        let mut answers = Vec::new();
        for _ in 0..6 {
            answers.push(check(&tokens, asker(&denials), &wrong, &wrong_headers).unwrap_err());
        }
        // The forward proxy's credential draws on the same allowance.
        for _ in 0..6 {
            answers.push(proxy_token(&tokens, asker(&denials), &proxy_wrong).unwrap_err());
        }
        let wrong_count = answers.iter().filter(|d| **d == Denied::Wrong).count();
        assert_eq!(wrong_count, 10, "{answers:?}");
        assert_eq!(answers.last(), Some(&Denied::Limited));
        assert_eq!(
            name(check(&tokens, asker(&denials), &right, &right_headers)),
            Err(Denied::Limited),
            "a valid token from an address over its limit is refused the same way"
        );
        let elsewhere = Asker {
            peer: IpAddr::from([192, 0, 2, 99]),
            denials: &denials,
        };
        assert_eq!(
            name(check(&tokens, elsewhere, &right, &right_headers)),
            Ok("one".into())
        );
        tokio::time::advance(std::time::Duration::from_millis(200)).await;
        assert_eq!(
            name(check(&tokens, asker(&denials), &right, &right_headers)),
            Ok("one".into()),
            "a fifth of a second refills one"
        );
    }

    #[test]
    fn no_tokens_configured_admits_every_request() {
        let (parsed, headers) = request("key=anything", "", None);
        let denials = Denials::default();
        assert!(
            check(&TokenTable::default(), asker(&denials), &parsed, &headers)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn base64_decodes_as_the_standard_says() {
        for (text, plain) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg", "foob"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(
                decode_base64(text.as_bytes()).as_deref(),
                Some(plain.as_bytes()),
                "{text}"
            );
        }
        for bad in ["Z", "Zm9vY", "Zm9v!", "Zm 9v"] {
            assert!(decode_base64(bad.as_bytes()).is_none(), "{bad}");
        }
    }
}
