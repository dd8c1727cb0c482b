//! The urlencoded codec of query strings and form bodies, on raw bytes: finding the
//! `name=value` pairs in place, decoding a name or value leniently as PHP does, encoding one
//! back, and splicing an `&`-joined list. Knows bytes and PHP's names, not requests: which
//! pairs to replace is the request's decision.

use std::borrow::Cow;
use std::ops::Range;

use super::param_name::php_name;

/// One `name=value` pair of an `&`-joined list, found by position.
pub(super) struct Pair {
    /// The whole pair, without its `&`.
    pub span: Range<usize>,
    /// The name, decoded and normalised as PHP keys it ([`php_name`]).
    pub name: Name,
    /// The value, still encoded (empty for a pair without `=`).
    pub value: Range<usize>,
}

/// A pair's name as PHP keys it.
pub(super) enum Name {
    /// A range of the raw bytes: the name had nothing to decode, so normalising only cut it
    /// shorter. The bytes are valid UTF-8.
    InPlace(Range<usize>),
    /// The name had escapes (or invalid UTF-8), so it is decoded into its own string.
    Decoded(String),
}

/// Every non-empty pair of `raw`, in order. Empty pairs (`&&`) are skipped, as PHP skips them.
pub(super) fn pairs(raw: &[u8]) -> impl Iterator<Item = Pair> + '_ {
    // memchr finds the separators a word at a time; values (URLs, tokens, images) are
    // the long part of a request and are not otherwise looked at.
    let ends = memchr::memchr_iter(b'&', raw).chain(std::iter::once(raw.len()));
    let mut start = 0;
    ends.filter_map(move |end| {
        let pair_start = start;
        start = end + 1;
        let pair = &raw[pair_start..end];
        if pair.is_empty() {
            return None;
        }
        let name_len = memchr::memchr(b'=', pair).unwrap_or(pair.len());
        let value_start = (name_len + 1).min(pair.len());
        let raw_name = &pair[..name_len];
        if is_its_own_php_name(raw_name) {
            return Some(Pair {
                span: pair_start..end,
                name: Name::InPlace(pair_start..pair_start + name_len),
                value: pair_start + value_start..end,
            });
        }
        let name = match decode(raw_name) {
            Cow::Borrowed(decoded) => {
                // Normalising only cuts a borrowed name shorter, so it stays a range of `raw`.
                let normal = php_name(decoded);
                let offset = normal.as_ptr() as usize - decoded.as_ptr() as usize;
                let at = pair_start + offset;
                Name::InPlace(at..at + normal.len())
            }
            Cow::Owned(decoded) => Name::Decoded(php_name(&decoded).to_owned()),
        };
        Some(Pair {
            span: pair_start..end,
            name,
            value: pair_start + value_start..end,
        })
    })
}

/// Whether a raw name is, byte for byte, what [`decode`] and [`php_name`] make of it: ASCII
/// with nothing to decode (`%`, `+`), no NUL or `[` to cut it at, no leading space. Nearly
/// every name is, and one pass over it is cheaper than decoding and normalising it.
fn is_its_own_php_name(raw: &[u8]) -> bool {
    raw.first() != Some(&b' ')
        && raw
            .iter()
            .all(|&b| b.is_ascii() && !matches!(b, b'%' | b'+' | 0 | b'['))
}

/// Decodes one urlencoded name or value: `+` is a space, `%XX` a byte, and invalid UTF-8 is
/// replaced, never an error. Borrows when there is nothing to decode, which is the usual case.
pub(super) fn decode(raw: &[u8]) -> Cow<'_, str> {
    if !raw.iter().any(|&b| b == b'%' || b == b'+') {
        return match std::str::from_utf8(raw) {
            Ok(text) => Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(raw),
        };
    }
    let spaced: Vec<u8> = raw
        .iter()
        .map(|&b| if b == b'+' { b' ' } else { b })
        .collect();
    let bytes: Cow<'_, [u8]> = percent_encoding::percent_decode(&spaced).into();
    Cow::Owned(String::from_utf8_lossy(&bytes).into_owned())
}

/// Appends `value` form-urlencoded. Keys and most values need no escaping, and copying
/// them whole is cheaper than serialising byte by byte.
pub(super) fn append_encoded(out: &mut Vec<u8>, value: &str) {
    let unreserved = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'*' | b'-' | b'.' | b'_');
    if value.as_bytes().iter().all(unreserved) {
        out.extend_from_slice(value.as_bytes());
    } else {
        out.extend(form_urlencoded::byte_serialize(value.as_bytes()).flat_map(str::bytes));
    }
}

/// Appends the pair `name=value`, both form-urlencoded, to the `&`-joined list that is
/// `buf[start..]`, with an `&` before it unless that list is empty or already ends with one.
pub(super) fn push_pair(buf: &mut Vec<u8>, start: usize, name: &str, value: &str) {
    if buf.len() > start && buf.last() != Some(&b'&') {
        buf.push(b'&');
    }
    buf.extend(form_urlencoded::byte_serialize(name.as_bytes()).flat_map(str::bytes));
    buf.push(b'=');
    buf.extend(form_urlencoded::byte_serialize(value.as_bytes()).flat_map(str::bytes));
}

/// A copy of an `&`-joined list in which some pairs are replaced or dropped, made in one
/// pass. Pairs must be given in the order they sit in the list; bytes between them are
/// copied as they were.
pub(super) struct Splice<'a> {
    raw: &'a [u8],
    out: Vec<u8>,
    /// `raw[copied..]` is what still has to be copied once a later pair changes.
    copied: usize,
}

impl<'a> Splice<'a> {
    /// A splice of `raw` written after what `out` already holds.
    pub(super) fn appending(raw: &'a [u8], mut out: Vec<u8>) -> Splice<'a> {
        out.reserve(raw.len() + 64);
        Splice {
            raw,
            out,
            copied: 0,
        }
    }

    /// Writes `name=value`, encoded, where the pair at `span` was.
    pub(super) fn replace(&mut self, span: Range<usize>, name: &str, value: &str) {
        self.out
            .extend_from_slice(&self.raw[self.copied..span.start]);
        append_encoded(&mut self.out, name);
        self.out.push(b'=');
        append_encoded(&mut self.out, value);
        self.copied = span.end;
    }

    /// Leaves out the pair at `span` with one `&`: the one before it if that is still to be
    /// copied, else the one after it, as dropping it from a split-and-join would.
    pub(super) fn remove(&mut self, span: Range<usize>) {
        if span.start > self.copied {
            self.out
                .extend_from_slice(&self.raw[self.copied..span.start - 1]);
            self.copied = span.end;
        } else {
            self.copied = (span.end + 1).min(self.raw.len());
        }
    }

    /// The list with every change made and the rest copied.
    pub(super) fn finish(mut self) -> Vec<u8> {
        self.out.extend_from_slice(&self.raw[self.copied..]);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each pair as (span text, PHP name, encoded value text), from the codec.
    fn found(raw: &str) -> Vec<(String, String, String)> {
        let text = |range: Range<usize>| raw[range].to_owned();
        pairs(raw.as_bytes())
            .map(|pair| {
                let name = match pair.name {
                    Name::InPlace(range) => text(range),
                    Name::Decoded(name) => name,
                };
                (text(pair.span), name, text(pair.value))
            })
            .collect()
    }

    #[test]
    fn pairs_are_found_in_place_with_php_names() {
        let raw = "a=1&&b&=v&%20key[]=K&c=1=2&+id=%41&";
        let expected = [
            ("a=1", "a", "1"),
            ("b", "b", ""),
            ("=v", "", "v"),
            ("%20key[]=K", "key", "K"),
            ("c=1=2", "c", "1=2"),
            ("+id=%41", "id", "%41"),
        ];
        let found = found(raw);
        assert_eq!(found.len(), expected.len(), "{found:?}");
        for (got, (span, name, value)) in found.iter().zip(expected) {
            assert_eq!(
                (got.0.as_str(), got.1.as_str(), got.2.as_str()),
                (span, name, value)
            );
        }
    }

    #[test]
    fn names_without_escapes_stay_ranges_of_the_input() {
        let raw = b"key=1&  key[x]=2&k%65y=3&\xff=4";
        let names: Vec<Name> = pairs(raw).map(|pair| pair.name).collect();
        assert!(matches!(&names[0], Name::InPlace(r) if &raw[r.clone()] == b"key"));
        // Leading spaces and the array suffix are cut off the range, not copied.
        assert!(matches!(&names[1], Name::InPlace(r) if &raw[r.clone()] == b"key"));
        assert!(matches!(&names[2], Name::Decoded(n) if n == "key"));
        assert!(matches!(&names[3], Name::Decoded(n) if n == "\u{fffd}"));
    }

    #[test]
    fn pairs_split_like_form_urlencoded_on_every_short_list() {
        const PIECES: [&str; 8] = ["a", "=", "&", "%41", "+", "b=c", "", "=="];
        for a in PIECES {
            for b in PIECES {
                for c in PIECES {
                    for d in PIECES {
                        let raw = [a, b, c, d].concat();
                        let ours: Vec<(String, String)> = pairs(raw.as_bytes())
                            .map(|pair| {
                                let name = match pair.name {
                                    Name::InPlace(range) => raw[range].to_owned(),
                                    Name::Decoded(name) => name,
                                };
                                (name, decode(&raw.as_bytes()[pair.value]).into_owned())
                            })
                            .collect();
                        // form_urlencoded splits and decodes the same way; only PHP's name
                        // normalisation is ours.
                        let theirs: Vec<(String, String)> = form_urlencoded::parse(raw.as_bytes())
                            .map(|(n, v)| (php_name(&n).to_owned(), v.into_owned()))
                            .collect();
                        assert_eq!(ours, theirs, "{raw:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn decode_borrows_unless_there_is_something_to_decode() {
        assert!(matches!(
            decode(b"plain-text_1.0"),
            Cow::Borrowed("plain-text_1.0")
        ));
        assert!(matches!(decode(b""), Cow::Borrowed("")));
        assert_eq!(decode(b"a+b%20c"), "a b c");
        assert_eq!(decode(b"%C3%A9"), "\u{e9}");
        // Invalid escapes stay as written; invalid UTF-8 is replaced, never refused.
        assert_eq!(decode(b"%zz%4"), "%zz%4");
        assert_eq!(decode(b"%FF"), "\u{fffd}");
        assert_eq!(decode(b"\xff"), "\u{fffd}");
    }

    #[test]
    fn append_encoded_matches_form_urlencoded_for_every_byte() {
        let every: String = (0u8..=127).map(char::from).chain(['é', '€']).collect();
        for value in ["", "abcXYZ019", "a*b-c.d_e", "a b+c&d=e", every.as_str()] {
            let mut out = Vec::new();
            append_encoded(&mut out, value);
            let expected: String = form_urlencoded::byte_serialize(value.as_bytes()).collect();
            assert_eq!(String::from_utf8(out).unwrap(), expected, "{value:?}");
        }
    }

    #[test]
    fn push_pair_adds_one_separator_only_where_needed() {
        for (list, expected) in [
            ("", "key=P%26Q"),
            ("a=1", "a=1&key=P%26Q"),
            ("a=1&", "a=1&key=P%26Q"),
            ("&", "&key=P%26Q"),
        ] {
            // Only the list after the prefix counts: a `?` before it is not a pair.
            let mut buf = b"/in.php?".to_vec();
            buf.extend_from_slice(list.as_bytes());
            push_pair(&mut buf, 8, "key", "P&Q");
            assert_eq!(buf, format!("/in.php?{expected}").as_bytes());
        }
    }

    #[test]
    fn splice_replaces_and_removes_pairs_with_their_separator() {
        let raw = "key=A&x=1&key=B&y=2";
        let spans: Vec<Range<usize>> = pairs(raw.as_bytes()).map(|pair| pair.span).collect();
        let mut splice = Splice::appending(raw.as_bytes(), Vec::new());
        splice.replace(spans[0].clone(), "key", "P Q");
        splice.remove(spans[2].clone());
        assert_eq!(splice.finish(), b"key=P+Q&x=1&y=2");

        // A removed first pair takes the `&` after it.
        let mut splice = Splice::appending(raw.as_bytes(), Vec::new());
        splice.remove(spans[0].clone());
        assert_eq!(splice.finish(), b"x=1&key=B&y=2");

        // Nothing changed: the copy is the input.
        assert_eq!(
            Splice::appending(raw.as_bytes(), Vec::new()).finish(),
            raw.as_bytes()
        );
    }
}
