//! Caller requests: the query and body parsed once into PHP-`$_REQUEST`-like params, the
//! strict reading of a param keyrelay decides on ([`ParsedRequest::single`]: one value under
//! every spelling, or a [`Conflict`]), and the byte-preserving rewrite that puts a pool key
//! and the checked values in. Owns which params are read and which pairs, parts or members
//! the rewrite replaces or drops; the bytes are handled by the codecs it calls
//! (`urlencoded`, `multipart`, `json_body`), after `body_kind` has said which one applies.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use bytes::Bytes;
use hyper::header::{HeaderMap, CONTENT_ENCODING, CONTENT_TYPE};
use hyper::http::uri::PathAndQuery;
use smallvec::SmallVec;

use super::body_kind::{body_kind, BodyKind};
use super::conflict::Conflict;
use super::param_name::{spells, spells_bytes};
use super::request_error::{echo, RequestError};
use super::urlencoded::{self, Name, Splice};
use super::{json_body, multipart};

/// A caller's request, parsed once: the raw query and body are kept so that
/// [`ParsedRequest::rewrite`] can copy every byte it does not replace.
#[derive(Clone)]
pub struct ParsedRequest {
    query: Query,
    body: Bytes,
    kind: BodyKind,
    /// Query pairs first, then body pairs, each in wire order; the last match wins. Names
    /// from the query, form and multipart bodies are as PHP keys them
    /// ([`php_name`](super::param_name::php_name)).
    params: Vec<Param>,
    /// The text of every [`Text::Owned`], by index: empty for the usual request, whose
    /// names and values all point into its query or body.
    owned: Vec<String>,
    layout: Layout,
}

/// The raw query (without `?`).
#[derive(Clone)]
enum Query {
    /// The query of the request target hyper parsed, shared with it rather than copied:
    /// the target, and where its query starts.
    Target(PathAndQuery, usize),
    /// A query given as text.
    Owned(String),
}

impl Query {
    /// The query of `target`, if it has one, without copying it.
    fn of_target(target: Option<&PathAndQuery>) -> Query {
        match target.and_then(|t| Some((t, t.query()?.len()))) {
            Some((target, len)) => Query::Target(target.clone(), target.as_str().len() - len),
            None => Query::Owned(String::new()),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Query::Target(target, start) => {
                target.as_str().as_bytes().get(*start..).unwrap_or_default()
            }
            Query::Owned(text) => text.as_bytes(),
        }
    }
}

/// One param. Urlencoded names and values point into the query or body rather than being
/// copied out, because a request is parsed for the few params keyrelay reads and then
/// forwarded. Small and `Copy`, so that the list for a typical submit is one allocation
/// that the allocator serves from its fast path.
#[derive(Clone, Copy)]
struct Param {
    name: Text,
    value: Text,
    /// Where a urlencoded pair sits in its source, for the rewrite; `None` for multipart and
    /// JSON params, which their own layouts splice.
    wire: Option<Wire>,
}

/// A `name=value` pair as sent: `span` is the pair.
#[derive(Clone, Copy)]
struct Wire {
    source: Source,
    span: Span,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Query,
    Body,
}

/// A byte range of the query or body; `Range` is not `Copy`.
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
}

impl Span {
    fn of(range: Range<usize>) -> Span {
        Span {
            start: range.start,
            end: range.end,
        }
    }

    fn range(self) -> Range<usize> {
        self.start..self.end
    }
}

#[derive(Clone, Copy)]
enum Text {
    /// Bytes of the query or body that are the text itself: UTF-8 with nothing to decode.
    Plain(Source, Span),
    /// Urlencoded bytes of the query or body, decoded when read.
    Encoded(Source, Span),
    /// Decoded at parse time (multipart and JSON params, and names that had escapes): the
    /// index of its text in `ParsedRequest::owned`.
    Owned(usize),
}

/// What the body was split into at parse time, so that `rewrite` splices without re-parsing.
#[derive(Clone)]
enum Layout {
    /// Empty and urlencoded bodies: re-split from the raw bytes, which is cheap.
    Raw,
    Multipart(Vec<multipart::Part>),
    Json(Vec<json_body::Member>),
}

/// What goes upstream after [`ParsedRequest::rewrite`]: the query (without `?`) and the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rewritten {
    pub query: String,
    pub body: Bytes,
}

// === impl ParsedRequest ===

impl ParsedRequest {
    /// [`ParsedRequest::parse`] for an HTTP request: takes the Content-Type from `headers`,
    /// and refuses what keyrelay cannot read with certainty rather than guess and forward it.
    ///
    /// # Errors
    /// As `parse`; and, for a request with a body, a Content-Type that is not ASCII or comes
    /// twice, or a Content-Encoding other than `identity`.
    pub fn parse_http(
        query: Option<&str>,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<ParsedRequest, RequestError> {
        let query = Query::Owned(query.unwrap_or_default().to_owned());
        ParsedRequest::parse_http_query(query, headers, body)
    }

    /// [`ParsedRequest::parse_http`] for a request as hyper hands it over: its query is
    /// read in place in the request target, which the parsed request shares rather than
    /// copies.
    ///
    /// # Errors
    /// As `parse_http`.
    pub fn parse_request(
        target: Option<&PathAndQuery>,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<ParsedRequest, RequestError> {
        ParsedRequest::parse_http_query(Query::of_target(target), headers, body)
    }

    fn parse_http_query(
        query: Query,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<ParsedRequest, RequestError> {
        if body.is_empty() {
            // Nothing to read, so nothing a header could make keyrelay misread.
            return ParsedRequest::parse_query(query, None, body);
        }
        let mut types = headers.get_all(CONTENT_TYPE).iter();
        let content_type = match (types.next(), types.next()) {
            (None, _) => None,
            (Some(value), None) => Some(
                value
                    .to_str()
                    .map_err(|_| RequestError::UnreadableContentType)?,
            ),
            (Some(_), Some(_)) => return Err(RequestError::AmbiguousContentType),
        };
        for encoding in headers.get_all(CONTENT_ENCODING) {
            let text = String::from_utf8_lossy(encoding.as_bytes());
            // Only HTTP's optional whitespace: `identity` followed by a no-break space is
            // not the identity coding, and an upstream may take it for some other coding.
            let encoded = text
                .split(',')
                .map(|coding| coding.trim_matches([' ', '\t']))
                .any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case("identity"));
            if encoded {
                return Err(RequestError::UnsupportedContentEncoding(
                    echo(&text).to_owned(),
                ));
            }
        }
        ParsedRequest::parse_query(query, content_type, body)
    }

    /// Parses the raw query (no `?`), the Content-Type header value and the body.
    ///
    /// Urlencoded values are not decoded here: [`ParsedRequest::param`] decodes the few that
    /// keyrelay reads, and the rewrite copies the rest as they came.
    ///
    /// # Errors
    /// A body whose Content-Type is unsupported, or which does not follow its encoding.
    /// The query never fails: it is decoded leniently, as PHP does.
    pub fn parse(
        query: Option<&str>,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<ParsedRequest, RequestError> {
        let query = Query::Owned(query.unwrap_or_default().to_owned());
        ParsedRequest::parse_query(query, content_type, body)
    }

    fn parse_query(
        query: Query,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<ParsedRequest, RequestError> {
        let kind = body_kind(content_type, &body)?;
        // Room for a typical submit, so the list is allocated once.
        let mut params = Vec::with_capacity(12);
        let mut owned = Vec::new();
        index_pairs(Source::Query, query.as_bytes(), &mut params, &mut owned);
        let layout = match &kind {
            BodyKind::Empty => Layout::Raw,
            BodyKind::Form => {
                index_pairs(Source::Body, &body, &mut params, &mut owned);
                Layout::Raw
            }
            BodyKind::Multipart { boundary } => {
                let parts = multipart::split(&body, boundary)?;
                let texts = multipart::text_params(&body, &parts);
                add_owned_params(texts, &mut params, &mut owned);
                Layout::Multipart(parts)
            }
            BodyKind::Json => {
                let members = json_body::parse(&body)?;
                add_owned_params(json_body::params(&members), &mut params, &mut owned);
                Layout::Json(members)
            }
        };
        Ok(ParsedRequest {
            query,
            body,
            kind,
            params,
            owned,
            layout,
        })
    }

    /// The value PHP's `$_REQUEST[name]` would hold: body beats query, last duplicate wins.
    /// File parts of a multipart body are not params. Names were normalised as PHP does
    /// (` key`, `key\0x` and `key[]` are all `key`), so `name` is a plain name. Borrowed
    /// unless the value had something to decode.
    pub fn param(&self, name: &str) -> Option<Cow<'_, str>> {
        // Body pairs come after query pairs, so the last match is the winner on both counts.
        self.params
            .iter()
            .rev()
            .find(|param| self.is_named(param, name))
            .map(|param| self.text(param.value))
    }

    /// The one value of a param keyrelay decides on, read strictly: every param that some
    /// reader could take for `name` ([`spells`]: `ID`, `id[]`, ` id`, `i%64`, a multipart part
    /// named so in any of its headers, text or file, a JSON member `"ID"`), in the query and
    /// the body alike. These are exactly the params [`ParsedRequest::rewrite`] replaces when
    /// it sets `name`, so what is read here is all the upstream could have read.
    ///
    /// The same value spelled twice is one value; "the same" is the same decoded text, byte
    /// for byte, because that is the one equality every reader agrees on: ` get` and `get`,
    /// or `0123` and `123`, are one value only to readers that trim or count, and keyrelay
    /// cannot know that the service is one. `None` when no param spells `name`.
    ///
    /// # Errors
    /// [`Conflict::Values`] when two of them carry different values: keyrelay would check
    /// one while the service, reading first, last or case-blind, might act on the other.
    pub fn single(&self, name: &'static str) -> Result<Option<Cow<'_, str>>, Conflict> {
        let mut found: Option<Cow<'_, str>> = None;
        let parts = match &self.layout {
            Layout::Multipart(parts) => Some(parts),
            Layout::Raw | Layout::Json(_) => None,
        };
        for param in &self.params {
            // A multipart body's params are PHP's reading of its text parts; its parts are
            // read below instead, under every name a reader could give them.
            if param.wire.is_none() && parts.is_some() {
                continue;
            }
            if self.spells(param, name) {
                agree(&mut found, self.text(param.value), name)?;
            }
        }
        if let Some(parts) = parts {
            for value in multipart::spelled_values(&self.body, parts, name) {
                agree(&mut found, value, name)?;
            }
        }
        Ok(found)
    }

    /// Every (name, value) pair, query first then body, in wire order; names as PHP keys
    /// them. Decodes every value, so it is for tests and tools, not the request path.
    pub fn params(&self) -> Vec<(String, String)> {
        self.params
            .iter()
            .map(|param| {
                (
                    self.text(param.name).into_owned(),
                    self.text(param.value).into_owned(),
                )
            })
            .collect()
    }

    /// Whether the caller asked for JSON answers (`json=1`, or `json=true`).
    pub fn wants_json(&self) -> bool {
        self.param("json").is_some_and(|v| {
            let v = v.trim();
            v == "1" || v.eq_ignore_ascii_case("true")
        })
    }

    /// The body's encoding.
    pub fn kind(&self) -> &BodyKind {
        &self.kind
    }

    /// Builds what goes upstream. For each `(name, value)` in `set`, every spelling of `name`
    /// that any reader could take for it ([`spells`]: `key[]`, `+key`, `KEY`, `k%65y`, a
    /// multipart part named so in any of its headers, …) is removed from the query and the
    /// body, and exactly one `name=value`, spelled canonically, takes the place of the first
    /// one: in the body if the body carried the name (the service reads the body over the
    /// query), else in the query, else appended to the query. All other bytes are copied
    /// unchanged. If `set` names a param twice, its first value is used.
    ///
    /// So whatever the caller wrote, the upstream sees one `key`, keyrelay's, and none of the
    /// caller's: a leftover spelling could reach a parser that prefers it, and the key's
    /// owner would be blamed for the caller's request.
    pub fn rewrite(&self, set: &[(&str, &str)]) -> Rewritten {
        self.rewrite_dropping(set, &[])
    }

    /// [`ParsedRequest::rewrite`], and every spelling of each name in `drop` removed too,
    /// with nothing written in its place: for a decision param keyrelay read as blank, or
    /// one that the request it sends must not carry at all (`ids` beside a checked `id`).
    pub fn rewrite_dropping(&self, set: &[(&str, &str)], drop: &[&str]) -> Rewritten {
        let mut query = Vec::new();
        let body = self.rewrite_into(set, drop, &mut query);
        // Only whole `&`-separated pairs and ASCII were spliced into valid UTF-8, so the
        // lossy conversion never replaces anything.
        let query = String::from_utf8(query)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        Rewritten { query, body }
    }

    /// [`ParsedRequest::rewrite_dropping`], with the query appended to `query` rather than
    /// returned: the proxy writes it straight into the upstream request target it is
    /// building, so the rewritten query is never a buffer of its own. Only what this call
    /// appends is the query (for where a separator goes); returns the body.
    pub fn rewrite_into(&self, set: &[(&str, &str)], drop: &[&str], query: &mut Vec<u8>) -> Bytes {
        // A dropped name is a name set with no value that counts as placed from the start:
        // the splices then remove every spelling of it and write none. Inline for the few
        // names an attempt sets, so no list is allocated for them.
        let mut names: SmallVec<[(&str, &str); 6]> = SmallVec::from_slice(set);
        names.extend(drop.iter().map(|name| (*name, "")));
        let mut placed: SmallVec<[bool; 6]> = SmallVec::from_elem(false, set.len());
        placed.extend(drop.iter().map(|_| true));
        let all = &names[..];

        let body = match &self.layout {
            Layout::Raw => self.splice_pairs(Source::Body, all, &mut placed),
            Layout::Multipart(parts) => multipart::splice(&self.body, parts, all, &mut placed),
            Layout::Json(members) => json_body::splice(members, all, &mut placed),
        };
        let body = body.map_or_else(|| self.body.clone(), Bytes::from);

        // Names the body took are only dropped from the query.
        let start = query.len();
        if !self.splice_pairs_into(Source::Query, all, &mut placed, query) {
            query.extend_from_slice(self.query.as_bytes());
        }

        for (i, (name, value)) in set.iter().enumerate() {
            if placed[i] || set[..i].iter().any(|(n, _)| n == name) {
                continue;
            }
            urlencoded::push_pair(query, start, name, value);
        }
        body
    }

    /// The length of the raw query, for sizing what a rewrite writes.
    pub fn query_len(&self) -> usize {
        self.query.as_bytes().len()
    }

    /// Replaces the first pair of `source` that spells a name of `set` not yet `placed` with
    /// the canonical `name=<encoded value>`, and drops every other pair spelling a name of
    /// `set`. Works from the pairs found at parse time, whose names are already decoded;
    /// every other pair is copied as it was. Marks in `placed` which names it wrote; returns
    /// `None` when nothing matched, so the caller keeps the original bytes.
    fn splice_pairs(
        &self,
        source: Source,
        set: &[(&str, &str)],
        placed: &mut [bool],
    ) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.splice_pairs_into(source, set, placed, &mut out)
            .then_some(out)
    }

    /// [`ParsedRequest::splice_pairs`], appending the spliced copy to `out`; returns whether
    /// anything matched (if not, `out` is left as it was).
    fn splice_pairs_into(
        &self,
        source: Source,
        set: &[(&str, &str)],
        placed: &mut [bool],
        out: &mut Vec<u8>,
    ) -> bool {
        let mut splice: Option<Splice<'_>> = None;
        for param in &self.params {
            let Some(wire) = param.wire.filter(|wire| wire.source == source) else {
                continue;
            };
            let Some(slot) = set.iter().position(|(n, _)| self.spells(param, n)) else {
                continue;
            };
            let splice = splice
                .get_or_insert_with(|| Splice::appending(self.source(source), std::mem::take(out)));
            if placed[slot] {
                splice.remove(wire.span.range());
            } else {
                placed[slot] = true;
                splice.replace(wire.span.range(), set[slot].0, set[slot].1);
            }
        }
        match splice {
            Some(splice) => {
                *out = splice.finish();
                true
            }
            None => false,
        }
    }

    /// Whether `param`'s name is a spelling of `name` to some reader ([`spells`]). Plain
    /// names are read as the bytes they are: they were checked to be UTF-8 when parsed.
    fn spells(&self, param: &Param, name: &str) -> bool {
        match param.name {
            Text::Plain(from, span) => spells_bytes(
                self.source(from).get(span.range()).unwrap_or_default(),
                name,
            ),
            other => spells(&self.text(other), name),
        }
    }

    /// Whether `param` is named `name`. Plain names are compared as bytes: they were
    /// checked to be UTF-8 when parsed, and every lookup compares every name.
    fn is_named(&self, param: &Param, name: &str) -> bool {
        match param.name {
            Text::Plain(from, span) => self.source(from).get(span.range()) == Some(name.as_bytes()),
            other => self.text(other) == name,
        }
    }

    /// The raw bytes a [`Text`] range points into.
    fn source(&self, source: Source) -> &[u8] {
        match source {
            Source::Query => self.query.as_bytes(),
            Source::Body => &self.body[..],
        }
    }

    fn text(&self, text: Text) -> Cow<'_, str> {
        match text {
            // Ranges were cut at ASCII delimiters of text checked to be UTF-8 at parse time.
            Text::Plain(from, span) => Cow::Borrowed(
                std::str::from_utf8(self.source(from).get(span.range()).unwrap_or_default())
                    .unwrap_or_default(),
            ),
            Text::Encoded(from, span) => {
                urlencoded::decode(self.source(from).get(span.range()).unwrap_or_default())
            }
            Text::Owned(index) => Cow::Borrowed(self.owned.get(index).map_or("", String::as_str)),
        }
    }
}

/// Adds `value` to what a strict reading of `name` has `found`: the first value is kept, an
/// equal one changes nothing, a different one is a conflict.
fn agree<'r>(
    found: &mut Option<Cow<'r, str>>,
    value: Cow<'r, str>,
    name: &'static str,
) -> Result<(), Conflict> {
    match found {
        None => *found = Some(value),
        Some(first) if *first == value => {}
        Some(_) => return Err(Conflict::Values { name }),
    }
    Ok(())
}

/// Shows param names only: values include the caller's key and can be megabytes of image.
impl fmt::Debug for ParsedRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<Cow<'_, str>> = self.params.iter().map(|p| self.text(p.name)).collect();
        f.debug_struct("ParsedRequest")
            .field("kind", &self.kind)
            .field("params", &names)
            .field("query_len", &self.query_len())
            .field("body_len", &self.body.len())
            .finish()
    }
}

// === urlencoded pairs (query and form bodies) ===

/// Files every pair of `raw` (from `source`) in `params`: its name as PHP keys it, in place
/// when it needed no decoding (else its text in `owned`), and its value left encoded in
/// place.
fn index_pairs(source: Source, raw: &[u8], params: &mut Vec<Param>, owned: &mut Vec<String>) {
    for pair in urlencoded::pairs(raw) {
        let name = match pair.name {
            Name::InPlace(range) => Text::Plain(source, Span::of(range)),
            Name::Decoded(name) => own(name, owned),
        };
        params.push(Param {
            name,
            value: Text::Encoded(source, Span::of(pair.value)),
            wire: Some(Wire {
                source,
                span: Span::of(pair.span),
            }),
        });
    }
}

fn add_owned_params(
    pairs: Vec<(String, String)>,
    params: &mut Vec<Param>,
    owned: &mut Vec<String>,
) {
    for (name, value) in pairs {
        let name = own(name, owned);
        let value = own(value, owned);
        params.push(Param {
            name,
            value,
            wire: None,
        });
    }
}

fn own(text: String, owned: &mut Vec<String>) -> Text {
    owned.push(text);
    Text::Owned(owned.len() - 1)
}

#[cfg(test)]
mod tests;
