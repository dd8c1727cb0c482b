//! Request parsing for the simulator: query, urlencoded, multipart and JSON bodies merged into
//! one parameter list the way PHP's `$_REQUEST` would. Deliberately independent of
//! `crate::captcha`, so the proxy's own rewriting is checked by a second parser
//! (`serde_urlencoded`, `multer`, `serde_json`).

use std::convert::Infallible;
use std::fmt;

use bytes::Bytes;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

/// One request as the simulator received and understood it.
#[derive(Clone, Debug)]
pub struct Received {
    /// HTTP method, e.g. `POST`.
    pub method: String,
    /// URI path, e.g. `/in.php`.
    pub path: String,
    /// Raw query string, without the `?`.
    pub query: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// Raw request body.
    pub body: Bytes,
    /// Merged parameters as the simulator understood them: query first, then body.
    pub params: Vec<(String, String)>,
    /// File parts of a multipart body.
    pub files: Vec<ReceivedFile>,
    /// The `key` parameter as the simulator saw it (body wins over query).
    pub key: Option<String>,
    /// The `action` parameter (body wins over query).
    pub action: Option<String>,
}

/// A file part of a multipart body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedFile {
    /// The part's field name (`file` for image uploads).
    pub field: String,
    /// The `filename` of its `Content-Disposition`, if any.
    pub filename: Option<String>,
    /// The part's own `Content-Type` header, as sent.
    pub content_type: Option<String>,
    /// The part's bytes, exactly.
    pub bytes: Bytes,
}

/// Query and body parameters after parsing.
pub(crate) struct Parsed {
    /// Query pairs, then body pairs.
    pub(crate) params: Vec<(String, String)>,
    pub(crate) files: Vec<ReceivedFile>,
    /// The body claimed a format it does not follow; its parameters were discarded.
    pub(crate) malformed: bool,
}

impl Parsed {
    /// The value PHP would see: the last occurrence wins, so body beats query.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        lookup(&self.params, name)
    }
}

pub(crate) fn lookup<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .rev()
        .find(|(param, _)| param == name)
        .map(|(_, value)| value.as_str())
}

/// Splits out the media type of a `Content-Type` value, lowercased, without parameters.
fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// Parses the query and, when its content type is one clients use, the body.
pub(crate) async fn parse(query: &str, content_type: Option<&str>, body: &Bytes) -> Parsed {
    let mut params: Vec<(String, String)> = serde_urlencoded::from_str(query).unwrap_or_default();
    let body_part = match content_type {
        Some(content_type) => parse_body(content_type, body).await,
        // No declared type: PHP would not read the body either.
        None => Ok(BodyParams::default()),
    };
    match body_part {
        Ok(body) => {
            params.extend(body.params);
            Parsed {
                params,
                files: body.files,
                malformed: false,
            }
        }
        Err(Malformed) => Parsed {
            params,
            files: Vec::new(),
            malformed: true,
        },
    }
}

#[derive(Default)]
struct BodyParams {
    params: Vec<(String, String)>,
    files: Vec<ReceivedFile>,
}

struct Malformed;

async fn parse_body(content_type: &str, body: &Bytes) -> Result<BodyParams, Malformed> {
    match essence(content_type).as_str() {
        "application/x-www-form-urlencoded" => {
            let params = serde_urlencoded::from_bytes(body).map_err(|_| Malformed)?;
            Ok(BodyParams {
                params,
                files: Vec::new(),
            })
        }
        "multipart/form-data" => parse_multipart(content_type, body.clone()).await,
        "application/json" => {
            if body.iter().all(u8::is_ascii_whitespace) {
                return Ok(BodyParams::default());
            }
            json_params(body).ok_or(Malformed)
        }
        // The npm `2captcha` client sends a JSON object labelled text/plain; any other text
        // body carries no parameters.
        "text/plain" => Ok(json_params(body).unwrap_or_default()),
        _ => Ok(BodyParams::default()),
    }
}

async fn parse_multipart(content_type: &str, body: Bytes) -> Result<BodyParams, Malformed> {
    let boundary = multer::parse_boundary(content_type).map_err(|_| Malformed)?;
    let stream = futures_util::stream::once(async move { Ok::<Bytes, Infallible>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut parsed = BodyParams::default();
    while let Some(field) = multipart.next_field().await.map_err(|_| Malformed)? {
        // PHP drops nameless parts; so do we.
        let Some(name) = field.name().map(str::to_owned) else {
            continue;
        };
        let filename = field.file_name().map(str::to_owned);
        let part_type = field
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let bytes = field.bytes().await.map_err(|_| Malformed)?;
        // Like PHP: a part with a filename is a file. A part without one that is not UTF-8
        // cannot be a parameter either, so it is kept as a file instead of being mangled.
        let text = match filename {
            Some(_) => None,
            None => std::str::from_utf8(&bytes).ok().map(str::to_owned),
        };
        match text {
            Some(value) => parsed.params.push((name, value)),
            None => parsed.files.push(ReceivedFile {
                field: name,
                filename,
                content_type: part_type,
                bytes,
            }),
        }
    }
    Ok(parsed)
}

/// A JSON object's members as string parameters, in document order; `None` if the body is
/// not a JSON object.
fn json_params(body: &[u8]) -> Option<BodyParams> {
    let object: OrderedObject = serde_json::from_slice(body).ok()?;
    let params = object
        .0
        .into_iter()
        .map(|(name, value)| (name, json_scalar(value)))
        .collect();
    Some(BodyParams {
        params,
        files: Vec::new(),
    })
}

/// How a JSON value reads as a form parameter: clients send `"json":1` and `"json":true`
/// interchangeably, so numbers and booleans keep their JSON spelling.
fn json_scalar(value: Value) -> String {
    match value {
        Value::String(text) => text,
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A JSON object that keeps its members in document order (serde_json's `Map` sorts them).
struct OrderedObject(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for OrderedObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;

        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = OrderedObject;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedObject, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, Value>()? {
                    members.push(member);
                }
                Ok(OrderedObject(members))
            }
        }

        deserializer.deserialize_map(ObjectVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[tokio::test]
    async fn body_wins_over_query_and_last_duplicate_wins() {
        let parsed = parse(
            "key=q&json=1&a=1",
            Some("application/x-www-form-urlencoded; charset=UTF-8"),
            &Bytes::from_static(b"key=b&a=2&a=3"),
        )
        .await;
        assert!(!parsed.malformed);
        assert_eq!(
            parsed.params,
            pairs(&[
                ("key", "q"),
                ("json", "1"),
                ("a", "1"),
                ("key", "b"),
                ("a", "2"),
                ("a", "3")
            ])
        );
        assert_eq!(parsed.get("key"), Some("b"));
        assert_eq!(parsed.get("a"), Some("3"));
        assert_eq!(parsed.get("json"), Some("1"));
        assert_eq!(parsed.get("missing"), None);
    }

    #[tokio::test]
    async fn json_keeps_document_order_and_spells_scalars() {
        let body = Bytes::from_static(
            br#"{"key":"k","json":1,"header_acao":true,"soft_id":4587,"x":null,"o":{"a":[1]}}"#,
        );
        let parsed = parse("", Some("application/json"), &body).await;
        assert_eq!(
            parsed.params,
            pairs(&[
                ("key", "k"),
                ("json", "1"),
                ("header_acao", "true"),
                ("soft_id", "4587"),
                ("x", ""),
                ("o", r#"{"a":[1]}"#)
            ])
        );
    }

    #[tokio::test]
    async fn malformed_bodies_are_flagged_and_keep_the_query() {
        let cases: [(&str, &[u8]); 4] = [
            ("application/json", b"{\"key\":"),
            ("application/json", b"[1,2]"),
            ("multipart/form-data", b"--x\r\n"),
            ("multipart/form-data; boundary=x", b"garbage without parts"),
        ];
        for (content_type, body) in cases {
            let parsed = parse("key=q", Some(content_type), &Bytes::copy_from_slice(body)).await;
            assert!(parsed.malformed, "{content_type} {body:?}");
            assert_eq!(parsed.params, pairs(&[("key", "q")]));
        }
    }

    #[tokio::test]
    async fn text_plain_that_is_not_json_and_unknown_types_add_nothing() {
        for content_type in ["text/plain;charset=UTF-8", "application/octet-stream"] {
            let parsed = parse("a=1", Some(content_type), &Bytes::from_static(b"key=x")).await;
            assert!(!parsed.malformed);
            assert_eq!(parsed.params, pairs(&[("a", "1")]));
        }
        let parsed = parse("", None, &Bytes::from_static(b"key=x")).await;
        assert!(parsed.params.is_empty());
        let parsed = parse("", Some("application/json"), &Bytes::from_static(b" \n")).await;
        assert!(!parsed.malformed);
        assert!(parsed.params.is_empty());
    }

    #[tokio::test]
    async fn multipart_splits_text_fields_from_files() {
        let mut body = Vec::new();
        body.extend_from_slice(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nk1\r\n\
              --XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.png\"\r\n\
              Content-Type: image/png\r\n\r\n",
        );
        body.extend_from_slice(&[0, 159, 146, 150, b'\r', b'\n', 255]);
        body.extend_from_slice(
            b"\r\n--XyZ\r\nContent-Disposition: form-data; name=\"blob\"\r\n\r\n\xff\xfe\r\n--XyZ--\r\n",
        );
        let parsed = parse(
            "",
            Some("multipart/form-data; boundary=XyZ"),
            &Bytes::from(body),
        )
        .await;
        assert!(!parsed.malformed);
        assert_eq!(parsed.params, pairs(&[("key", "k1")]));
        assert_eq!(
            parsed.files,
            vec![
                ReceivedFile {
                    field: "file".to_owned(),
                    filename: Some("a.png".to_owned()),
                    content_type: Some("image/png".to_owned()),
                    bytes: Bytes::from_static(&[0, 159, 146, 150, b'\r', b'\n', 255]),
                },
                ReceivedFile {
                    field: "blob".to_owned(),
                    filename: None,
                    content_type: None,
                    bytes: Bytes::from_static(b"\xff\xfe"),
                },
            ]
        );
    }
}
