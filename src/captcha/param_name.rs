//! Parameter names as the readers of a request see them: [`php_name`], the name PHP files a
//! param under, for what keyrelay reads; and [`spells`], the loose rule for what keyrelay
//! replaces, which counts every spelling *some* reader could take for the name.
//!
//! Two rules, because they answer different questions. Reading must agree with the service
//! (PHP-like), or keyrelay would act on a value the service never sees. Replacing must cover
//! every reader, because keyrelay cannot know which parser the service runs: a spelling left
//! in place is a second, caller-chosen `key` that a stricter or looser parser may pick up.

use std::borrow::Cow;

/// The name PHP files a decoded param name under in `$_REQUEST` (php-src
/// `php_register_variable_ex`): cut at the first NUL (it handles names as C strings), leading
/// spaces dropped, and for `name[...]` only the part before `[`, because PHP makes
/// `$_REQUEST['name']` an array from it. A `[` with no `]` after it is not an array (PHP
/// turns it into `_`), so such a name is kept. Comparing normalised names means no spelling
/// PHP reads as `key` passes keyrelay as some other param.
pub(crate) fn php_name(name: &str) -> &str {
    // Byte loops rather than str searches: names are a few bytes long, and every name of
    // every request comes through here. Each cut is at an ASCII byte, so a char boundary.
    let bytes = name.as_bytes();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let start = bytes[..end].iter().position(|&b| b != b' ').unwrap_or(end);
    let name = &name[start..end];
    let bytes = name.as_bytes();
    match bytes.iter().position(|&b| b == b'[') {
        Some(open) if bytes[open..].contains(&b']') => &name[..open],
        _ => name,
    }
}

/// Whether `name` (already decoded once by its encoding) is a spelling of `canonical` to any
/// plausible reader: PHP, a framework that trims or folds case, one that decodes twice.
///
/// The name is cut at a NUL and at the first `[` (with or without a `]`), stripped of
/// whitespace, control and invisible characters at both ends, compared without ASCII case,
/// and, if it holds a `%`, compared once more percent-decoded. `canonical` is a plain ASCII
/// name such as `key`.
///
/// Deliberately wider than any one parser: a param it catches is dropped or replaced, and no
/// captcha API param is named like `key` without being it.
pub(crate) fn spells(name: &str, canonical: &str) -> bool {
    spells_bytes(name.as_bytes(), canonical)
}

/// [`spells`] for a name given as its UTF-8 bytes. Every param of every request comes
/// through here once per name the rewrite sets, so the usual case (plain ASCII, no `%`) is
/// one pass over the bytes, with no decoding and no allocation.
pub(crate) fn spells_bytes(name: &[u8], canonical: &str) -> bool {
    let wanted = canonical.as_bytes();
    // The shortest spelling is the name itself.
    if name.len() < wanted.len() {
        return false;
    }
    // Nearly every name is some other param's, and its first byte already tells. An ASCII
    // first byte that is no filler and no `%` (which may decode to anything) starts every
    // reading of the name, trimmed or decoded; unless it is the wanted name's first letter,
    // none of them spells it. (A NUL or `[` there cuts the name to nothing, which spells
    // nothing either.) This spares the full rule's passes for every other param.
    if let (Some(&first), Some(&head)) = (name.first(), wanted.first()) {
        if first.is_ascii()
            && first != b'%'
            && !is_ascii_filler(first)
            && !first.eq_ignore_ascii_case(&head)
        {
            return false;
        }
    }
    if name.is_ascii() && !name.contains(&b'%') {
        // The same rule as `loose_eq`, for ASCII: fillers, the name, fillers, then the end,
        // a NUL or a `[`. A NUL or `[` before the name cuts it to nothing.
        let start = name
            .iter()
            .position(|&b| !is_ascii_filler(b))
            .unwrap_or(name.len());
        let rest = &name[start..];
        if rest.len() < wanted.len() || !rest[..wanted.len()].eq_ignore_ascii_case(wanted) {
            return false;
        }
        let tail = &rest[wanted.len()..];
        let end = tail
            .iter()
            .position(|&b| b == 0 || b == b'[')
            .unwrap_or(tail.len());
        return tail[..end].iter().all(|&b| is_ascii_filler(b));
    }
    let name = String::from_utf8_lossy(name);
    if loose_eq(&name, canonical) {
        return true;
    }
    if !name.contains('%') {
        return false;
    }
    let decoded: Cow<'_, str> = percent_encoding::percent_decode_str(&name).decode_utf8_lossy();
    loose_eq(&decoded, canonical)
}

/// [`is_filler`] for an ASCII byte. NUL is not one: it ends a name.
fn is_ascii_filler(byte: u8) -> bool {
    byte != 0 && (byte == b' ' || byte.is_ascii_control())
}

fn loose_eq(name: &str, canonical: &str) -> bool {
    let name = name.split(['\0', '[']).next().unwrap_or_default();
    name.trim_matches(is_filler).eq_ignore_ascii_case(canonical)
}

/// Characters a lenient reader strips from a name's ends, or that a person cannot see:
/// whitespace, controls, and Unicode's Default_Ignorable_Code_Point set (zero-width and
/// bidi formatting characters, variation selectors, fillers, tags, the soft hyphen).
fn is_filler(c: char) -> bool {
    c.is_whitespace()
        || c.is_control()
        || matches!(
            c,
            '\u{00ad}'
                | '\u{034f}'
                | '\u{061c}'
                | '\u{115f}'..='\u{1160}'
                | '\u{17b4}'..='\u{17b5}'
                | '\u{180b}'..='\u{180f}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{3164}'
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{feff}'
                | '\u{ffa0}'
                | '\u{fff0}'..='\u{fff8}'
                | '\u{1bca0}'..='\u{1bca3}'
                | '\u{1d173}'..='\u{1d17a}'
                | '\u{e0000}'..='\u{e0fff}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn php_name_follows_php() {
        for (raw, php) in [
            ("key", "key"),
            (" key", "key"),
            ("  key", "key"),
            ("key[]", "key"),
            ("key[a][b]", "key"),
            ("key[", "key["),
            ("key\0junk", "key"),
            ("\0key", ""),
            ("key ", "key "),
            ("KEY", "KEY"),
        ] {
            assert_eq!(php_name(raw), php, "{raw:?}");
        }
    }

    #[test]
    fn php_name_normalises_like_php_register_variable() {
        let cases = [
            ("key", "key"),
            (" key", "key"),
            ("   key", "key"),
            ("key\0x", "key"),
            ("key\0[", "key"),
            ("\0key", ""),
            ("key[]", "key"),
            ("key[x]", "key"),
            ("key[x]junk", "key"),
            (" key[ ]", "key"),
            ("key[a][b]", "key"),
            ("[x]", ""),
            // No `]` after the `[`: PHP makes it `key_`, not an array.
            ("key[", "key["),
            ("key[x", "key[x"),
            ("key]", "key]"),
            // Only leading spaces go; tabs, trailing spaces and inner spaces stay.
            ("\tkey", "\tkey"),
            ("key ", "key "),
            ("k ey", "k ey"),
            ("KEY", "KEY"),
            ("", ""),
        ];
        for (name, expected) in cases {
            assert_eq!(php_name(name), expected, "{name:?}");
        }
    }

    #[test]
    fn every_reader_s_spelling_of_key_is_key() {
        for name in [
            "key",
            "KEY",
            "Key",
            " key",
            "key ",
            "\tkey\r\n",
            "key[]",
            "key[0]",
            "key[",
            "key\0x",
            "key [ ]",
            "\u{feff}key",
            "key\u{200b}",
            "\u{a0}key",
            // Invisible too, found with the fuzz harness's spelling rule: bidi overrides and
            // isolates, the Mongolian vowel separator (whitespace to older Unicode tables),
            // a Hangul filler, a variation selector, a tag character.
            "\u{202e}key",
            "key\u{2066}",
            "\u{180e}key",
            "\u{3164}key",
            "\u{fe0f}key",
            "key\u{e0020}",
            "k%65y",
            "%6B%65%79",
            "%20key%5B%5D",
            "key%00",
        ] {
            assert!(spells(name, "key"), "{name:?}");
        }
    }

    #[test]
    fn the_ascii_fast_path_agrees_with_the_general_rule() {
        let pieces = [
            "", "k", "e", "y", "K", "E", "Y", "key", "KEY", " ", "\t", "\0", "[", "]", "_", ".",
            "%", "x", "\x01", "\x7f",
        ];
        let mut checked = 0;
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    for d in pieces {
                        let name = format!("{a}{b}{c}{d}");
                        if name.contains('%') {
                            continue;
                        }
                        assert_eq!(
                            spells_bytes(name.as_bytes(), "key"),
                            loose_eq(&name, "key"),
                            "{name:?}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100_000, "{checked}");
    }

    /// The whole rule, spelled out slowly: the name, or its percent-decoding, loosely
    /// equal to the canonical name. Every shortcut of `spells_bytes` must agree with it.
    fn spells_slowly(name: &str, canonical: &str) -> bool {
        let decoded = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
        loose_eq(name, canonical) || loose_eq(&decoded, canonical)
    }

    #[test]
    fn every_shortcut_agrees_with_the_whole_rule_decoding_included() {
        // First bytes of every kind (letters of both names and others, fillers, cuts, `%`
        // escapes, non-ASCII fillers and letters) before and around the names' letters, so
        // that each canonical name is spelled by some of them and missed by the rest.
        let pieces = [
            "", "k", "K", "ey", "key", "j", "J", "son", "json", "x", "m", " ", "\t", "\0", "[",
            "%", "%6B", "%6b", "%6A", "%20", "%00", "\u{200b}", "\u{feff}", "é", "ｋ",
        ];
        let (mut checked, mut spelled) = (0, [0; 2]);
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    let name = format!("{a}{b}{c}");
                    for (i, canonical) in ["key", "json"].into_iter().enumerate() {
                        let slowly = spells_slowly(&name, canonical);
                        assert_eq!(
                            spells_bytes(name.as_bytes(), canonical),
                            slowly,
                            "{name:?} as {canonical}"
                        );
                        checked += 1;
                        spelled[i] += usize::from(slowly);
                    }
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
        assert!(
            spelled.iter().all(|&n| n > 50),
            "both names spelled: {spelled:?}"
        );
    }

    #[test]
    fn other_names_are_not_key() {
        for name in [
            "", "ke", "keys", "k ey", "monkey", "key_", "key.", "keyx", "xkey", "api_key", "k%",
            "%6B%65", "[key]", "k\0ey",
        ] {
            assert!(!spells(name, "key"), "{name:?}");
        }
    }
}
