//! The fast path for what users feed `plan` most: one `kubectl get ... -o json` List.
//!
//! The List is split into its items without building JSON trees (each item is a borrowed slice
//! of the text), and the items are decoded in parallel straight into the types the conversion
//! reads ([`super::slim`]). Anything else — YAML, several documents, a single object, a List
//! with nested Lists or a malformed one — returns `None` and takes the general path
//! ([`super::parse_text`] then [`super::convert`]), which defines every error message; decode
//! errors here name the same file, object and field as there.

use super::decode::{decode_all, RawObject};
use super::{convert_decoded, LoadedSnapshot, SnapshotError};
use rayon::prelude::*;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;

/// A List's kind and its items, unparsed.
#[derive(Deserialize)]
struct ListIn<'a> {
    #[serde(borrow, rename = "apiVersion")]
    api_version: Option<&'a str>,
    #[serde(borrow)]
    kind: Option<&'a str>,
    #[serde(borrow)]
    items: Option<Items<'a>>,
}

/// A List's items, at most [`crate::limits::MAX_LIST_ITEMS`] (counted as they are read).
struct Items<'a>(Vec<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Items<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Items<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Items<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(item) = seq.next_element::<&'de RawValue>()? {
                    if out.len() == crate::limits::MAX_LIST_ITEMS {
                        return Err(serde::de::Error::custom(TOO_MANY));
                    }
                    out.push(item);
                }
                Ok(Items(out))
            }
        }
        d.deserialize_seq(V)
    }
}

/// The message of a List past [`crate::limits::MAX_LIST_ITEMS`].
const TOO_MANY: &str = "too many items";

/// What an item is, read before decoding it.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow, rename = "apiVersion")]
    api_version: Option<&'a str>,
    #[serde(borrow)]
    kind: Option<&'a str>,
    #[serde(borrow)]
    items: Option<&'a RawValue>,
}

/// The head of an object that starts with `apiVersion` and `kind` (in either order), as the API
/// server and kubectl write every object, read off its first bytes; `None` for anything else
/// (it is then read by deserializing the whole item).
fn leading_head(text: &str) -> Option<Head<'_>> {
    let mut rest = text.trim_start().strip_prefix('{')?;
    let mut head = Head { api_version: None, kind: None, items: None };
    for _ in 0..2 {
        let (key, after) = plain_string(rest)?;
        let (value, after) = plain_string(after.trim_start().strip_prefix(':')?)?;
        match key {
            "apiVersion" => head.api_version = Some(value),
            "kind" => head.kind = Some(value),
            _ => return None,
        }
        rest = after.trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
    // A `kind: ...List` object may hold items; only the full read can say.
    (head.api_version.is_some() && head.kind.is_some_and(|k| !k.ends_with("List"))).then_some(head)
}

/// A JSON string without escapes at the start of `text` (after whitespace), and what follows.
fn plain_string(text: &str) -> Option<(&str, &str)> {
    let body = text.trim_start().strip_prefix('"')?;
    let end = body.find(['"', '\\'])?;
    (body.as_bytes()[end] == b'"').then(|| (&body[..end], &body[end + 1..]))
}

/// Converts the documents `docs` of the file `name` (JSON text: the file itself, or its YAML
/// documents transcoded) when each is a List of objects, an object with its `apiVersion` and
/// `kind`, or empty; `None` sends the file down the general path.
pub(super) fn convert(name: &str, docs: &[&str]) -> Option<Result<LoadedSnapshot, SnapshotError>> {
    let names: Vec<String> = (1..=docs.len())
        .map(|n| if docs.len() > 1 { format!("{name} doc {n}") } else { name.to_string() })
        .collect();
    let (mut items, mut saw_list) = (Vec::new(), false);
    for (doc, file) in docs.iter().zip(&names) {
        if doc.trim() == "null" {
            continue;
        }
        match doc_items(file, doc)? {
            Ok((mut found, list)) => {
                items.append(&mut found);
                saw_list |= list;
            }
            Err(e) => return Some(Err(e)),
        }
    }
    if items.is_empty() && !saw_list {
        // The general path says why there is nothing to read.
        return None;
    }
    match decode_all(&items) {
        // A duplicate key: kubectl (Go's JSON decoding) keeps the last value, as the general
        // path's JSON values do; the typed decode here refuses it, so that path reads the file.
        Err(SnapshotError::Decode { message, .. }) if message.starts_with("duplicate field") => None,
        decoded => Some(decoded.and_then(convert_decoded)),
    }
}

/// The items of one document (named `file` in errors) and whether it is a List; `None` when
/// it is neither a List of objects nor an object with its `apiVersion` and `kind`.
fn doc_items<'a>(file: &'a str, doc: &'a str) -> Option<Result<(Vec<Item<'a>>, bool), SnapshotError>> {
    let list: ListIn<'_> = match serde_json::from_str(doc) {
        Ok(list) => list,
        Err(e) if e.to_string().starts_with(TOO_MANY) => return Some(Err(too_many(file))),
        Err(_) => return None,
    };
    let kind = list.kind?;
    let Some(items) = list.items else {
        // A `...List` without items: the general path says whether it is one.
        let single = Item { file, index: None, api_version: list.api_version?, kind, text: doc };
        return (!kind.ends_with("List")).then_some(Ok((vec![single], false)));
    };
    let items = items.0;
    let item_kind = kind.strip_suffix("List")?;
    // The general path adds a typed List's kind to its items (`PodList` items have none).
    let default_head = (!item_kind.is_empty()).then(|| (list.api_version.unwrap_or(""), item_kind));
    let heads: Vec<(&str, &str)> = items
        .par_iter()
        .map(|raw| {
            let head =
                leading_head(raw.get()).or_else(|| serde_json::from_str::<Head<'_>>(raw.get()).ok())?;
            let nested = head.kind.is_some_and(|k| k.ends_with("List")) && head.items.is_some();
            if nested {
                return None;
            }
            // (A kind or apiVersion with escapes fails to borrow, and the List takes the general
            // path.)
            match (head.api_version, head.kind) {
                (Some(v), Some(k)) => Some((v, k)),
                (None, None) => default_head,
                (None, Some(k)) => Some(("", k)),
                (Some(_), None) => None,
            }
        })
        .collect::<Option<Vec<_>>>()?;
    let items = items
        .into_iter()
        .zip(heads)
        .enumerate()
        .map(|(index, (raw, (api_version, kind)))| Item {
            file,
            index: Some(index),
            api_version,
            kind,
            text: raw.get(),
        })
        .collect();
    Some(Ok((items, true)))
}

/// A List past [`crate::limits::MAX_LIST_ITEMS`].
fn too_many(origin: &str) -> SnapshotError {
    SnapshotError::Invalid {
        origin: origin.to_string(),
        object: "List".into(),
        field: "items".into(),
        value: format!("more than {} items", crate::limits::MAX_LIST_ITEMS),
        reason: format!(
            "at most {} objects in one List (five times the pods of a 5,000-node cluster at 110 pods a node)",
            crate::limits::MAX_LIST_ITEMS
        ),
    }
}

/// Checks one JSON document (a file, or a YAML document transcoded) against the bounds of
/// [`crate::limits`] on its text, before the general path parses it into a JSON value (which
/// costs many times the text for an object of a million labels): the object, or each item of a
/// List. What cannot be read here is left to the general path, which names it.
pub(super) fn check_single(name: &str, text: &str) -> Result<(), SnapshotError> {
    let Ok(head) = serde_json::from_str::<Head<'_>>(text) else { return Ok(()) };
    match (head.api_version, head.kind, head.items) {
        (Some(api_version), Some(kind), None) => {
            super::decode::check_bounds(&Item { file: name, index: None, api_version, kind, text })
        }
        (list_version, Some(list_kind), Some(items)) if list_kind.ends_with("List") => {
            let Ok(Items(items)) = serde_json::from_str::<Items<'_>>(items.get()) else { return Ok(()) };
            let item_kind = list_kind.strip_suffix("List").unwrap_or_default();
            for (index, raw) in items.into_iter().enumerate() {
                let Ok(item) = serde_json::from_str::<Head<'_>>(raw.get()) else { continue };
                super::decode::check_bounds(&Item {
                    file: name,
                    index: Some(index),
                    api_version: item.api_version.or(list_version).unwrap_or_default(),
                    kind: item.kind.unwrap_or(item_kind),
                    text: raw.get(),
                })?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// One List item, still text.
struct Item<'a> {
    file: &'a str,
    /// Its place in the List (none for a file that is one object).
    index: Option<usize>,
    api_version: &'a str,
    kind: &'a str,
    text: &'a str,
}

impl RawObject for Item<'_> {
    fn head(&self) -> (&str, &str) {
        (self.api_version, self.kind)
    }
    fn origin(&self) -> Cow<'_, str> {
        match self.index {
            Some(i) => Cow::Owned(format!("{} items[{i}]", self.file)),
            None => Cow::Borrowed(self.file),
        }
    }
    /// The message drops serde_json's position in the item (the general path, decoding a JSON
    /// value, has none).
    fn decode<T: DeserializeOwned>(&self) -> Result<T, SnapshotError> {
        let mut de = serde_json::Deserializer::from_str(self.text);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            let message = inner.to_string();
            let at = format!(" at line {} column {}", inner.line(), inner.column());
            SnapshotError::Decode {
                origin: self.origin().into_owned(),
                object: RawObject::describe(self),
                field,
                message: message.strip_suffix(&at).unwrap_or(&message).to_string(),
            }
        })
    }
    fn value(&self) -> Cow<'_, Value> {
        // The text parsed as a whole List, so it parses.
        Cow::Owned(serde_json::from_str(self.text).unwrap_or(Value::Null))
    }
    fn check_bounds(&self) -> Option<super::bounds::Violation> {
        super::bounds::check_text(self.kind, self.text)
    }
    /// Read off the name and namespace alone: the item may be one too large to parse whole.
    fn describe(&self) -> String {
        #[derive(Deserialize, Default)]
        struct Meta {
            name: Option<String>,
            namespace: Option<String>,
        }
        #[derive(Deserialize)]
        struct Named {
            #[serde(default)]
            metadata: Option<Meta>,
        }
        let meta = serde_json::from_str::<Named>(self.text).ok().and_then(|n| n.metadata).unwrap_or_default();
        let kind = if self.kind.is_empty() { "object" } else { self.kind };
        let name = meta.name.as_deref().unwrap_or("<unnamed>");
        match meta.namespace {
            Some(ns) => format!("{kind} {ns}/{name}"),
            None => format!("{kind} {name}"),
        }
    }
}
