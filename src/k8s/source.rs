//! Reading objects out of files: JSON (a `v1 List`, a single object, an array or a stream of
//! objects), multi-document YAML, and folders of both.

use super::error::SnapshotError;
use crate::textfile::{read_text, read_text_sized, InputLimits, TextError};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// One Kubernetes object as read, before conversion, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct SourcedObject {
    /// File and position in it, e.g. `snap.json items[3]` or `pods.yaml doc 2`; used in errors.
    pub origin: String,
    /// The object.
    pub value: Value,
}

impl SourcedObject {
    /// An object with an origin label, for objects that do not come from a file.
    pub fn new(origin: impl Into<String>, value: Value) -> Self {
        Self { origin: origin.into(), value }
    }
}

/// Reads every object under `path`: a file, or a directory walked recursively for `*.json`,
/// `*.yaml` and `*.yml` files in path order; `-` is standard input. Default input limits.
pub fn read_path(path: &Path, warnings: &mut Vec<String>) -> Result<Vec<SourcedObject>, SnapshotError> {
    read_path_with(path, InputLimits::default(), warnings)
}

/// [`read_path`] within `limits`. In a folder, what is not a manifest of Kubernetes objects is
/// skipped with one warning naming it: binary data, Helm or Go templates that do not parse, empty
/// files, package and tool manifests (`package.json`, `tsconfig.json`, a Helm chart's
/// `Chart.yaml` and `values.yaml`), files whose documents are none of them a Kubernetes object
/// (no `kind`, nor `apiVersion` with `metadata`), and anything that is not a regular file (FIFOs,
/// devices and sockets are never opened). A file named directly must parse.
pub fn read_path_with(
    path: &Path,
    limits: InputLimits,
    warnings: &mut Vec<String>,
) -> Result<Vec<SourcedObject>, SnapshotError> {
    if let Some((name, text)) = read_single(path, limits)? {
        return parse_text(&name, &text);
    }
    let mut files = Vec::new();
    collect_files(path, &mut files, warnings)?;
    files.sort();
    if files.is_empty() {
        return Err(SnapshotError::NotObjects {
            origin: path.display().to_string(),
            reason: "no *.json, *.yaml or *.yml files in the folder".into(),
        });
    }
    let mut out = Vec::new();
    let mut read_any = false;
    for file in files {
        if let Some(what) = known_non_manifest(&file) {
            warnings.push(format!("{}: {what}, not Kubernetes objects; skipped", file.display()));
            continue;
        }
        let text = match read_folder_file(&file, limits) {
            Err(SnapshotError::Text { origin, reason: reason @ TextError::Binary { .. } }) => {
                warnings.push(format!("{origin}: {reason}; skipped"));
                continue;
            }
            other => other?,
        };
        match parse_text(&file, &text) {
            Ok(objects) if !objects.iter().any(|o| is_kubernetes_object(&o.value)) => {
                warnings.push(format!(
                    "{}: no document in it is a Kubernetes object (none has a kind, nor an apiVersion with metadata); skipped",
                    file.display()
                ));
                continue;
            }
            Ok(objects) => out.extend(objects),
            Err(e @ (SnapshotError::Json { .. } | SnapshotError::Yaml { .. })) if text.contains("{{") => {
                warnings.push(format!(
                    "{e}; skipped: a Helm or Go template (render it first with `helm template`)"
                ));
                continue;
            }
            Err(e @ SnapshotError::Empty { .. }) => {
                // An empty manifest among others is common (a placeholder, a file of comments).
                warnings.push(format!("{e}; skipped"));
                continue;
            }
            Err(e) => return Err(e),
        }
        read_any = true;
    }
    if !read_any {
        return Err(SnapshotError::NotObjects {
            origin: path.display().to_string(),
            reason: "no file in the folder holds Kubernetes objects".into(),
        });
    }
    Ok(out)
}

/// The name standard input goes by in messages.
const STDIN: &str = "<stdin>";

/// The text of `path` and the name it goes by when it is one file or `-` (standard input);
/// `None` for a folder.
pub(crate) fn read_single(
    path: &Path,
    limits: InputLimits,
) -> Result<Option<(PathBuf, String)>, SnapshotError> {
    if path == Path::new("-") {
        let text = read_text(std::io::stdin().lock(), limits)
            .map_err(|reason| SnapshotError::Text { origin: STDIN.into(), reason })?;
        return Ok(Some((PathBuf::from(STDIN), text)));
    }
    let meta =
        std::fs::metadata(path).map_err(|cause| SnapshotError::Io { path: path.to_path_buf(), cause })?;
    if meta.is_dir() {
        return Ok(None);
    }
    Ok(Some((path.to_path_buf(), read_file(path, limits)?)))
}

/// Whether the file is JSON: by its extension, else by its first character.
pub(crate) fn is_json(path: &Path, text: &str) -> bool {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("json") => true,
        Some("yaml" | "yml") => false,
        _ => text.trim_start().starts_with(['{', '[']),
    }
}

/// Well-known files that share manifests' extensions but hold no Kubernetes objects (package and
/// tool manifests, a Helm chart's definition and values), and what each is.
fn known_non_manifest(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
    Some(match name {
        "package.json" | "package-lock.json" | "composer.json" => "a package manifest",
        "Chart.yaml" => "a Helm chart's definition",
        "values.schema.json" => "a Helm chart's values schema",
        "jsconfig.json" => "a JavaScript project config",
        _ if name.starts_with("tsconfig") && name.ends_with(".json") => "a TypeScript project config",
        _ if name.starts_with("values") && yaml => "Helm values",
        _ => return None,
    })
}

/// Whether a document is meant as a Kubernetes object: it has a `kind`, or an `apiVersion` and
/// `metadata` (an object missing its kind still fails, naming the field).
fn is_kubernetes_object(value: &Value) -> bool {
    value.get("kind").is_some_and(Value::is_string)
        || (value.get("apiVersion").is_some_and(Value::is_string)
            && value.get("metadata").is_some_and(Value::is_object))
}

/// A file of a folder: only a regular file (or a link to one) is read, and it is opened without
/// blocking, so that a FIFO, device or socket swapped in after the walk cannot hang the read.
fn read_folder_file(path: &Path, limits: InputLimits) -> Result<String, SnapshotError> {
    let io = |cause| SnapshotError::Io { path: path.to_path_buf(), cause };
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = options.open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(SnapshotError::NotObjects {
            origin: path.display().to_string(),
            reason: format!("{}, not a regular file", special_kind(&meta.file_type())),
        });
    }
    read_text_sized(file, limits, meta.len())
        .map_err(|reason| SnapshotError::Text { origin: path.display().to_string(), reason })
}

/// What a file that is not a regular file or folder is, for warnings.
#[cfg(unix)]
fn special_kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else if t.is_dir() {
        "a folder"
    } else {
        "not a regular file"
    }
}

#[cfg(not(unix))]
fn special_kind(t: &std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a folder"
    } else {
        "not a regular file"
    }
}

fn read_file(path: &Path, limits: InputLimits) -> Result<String, SnapshotError> {
    let io = |cause| SnapshotError::Io { path: path.to_path_buf(), cause };
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    read_text_sized(file, limits, size)
        .map_err(|reason| SnapshotError::Text { origin: path.display().to_string(), reason })
}

fn collect_files(
    dir: &Path,
    out: &mut Vec<PathBuf>,
    warnings: &mut Vec<String>,
) -> Result<(), SnapshotError> {
    let io = |cause| SnapshotError::Io { path: dir.to_path_buf(), cause };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let path = entry.path();
        let file_type = entry.file_type().map_err(io)?;
        if file_type.is_dir() {
            collect_files(&path, out, warnings)?;
            continue;
        }
        // Symlinks to files are followed; symlinked directories are not (no cycles).
        if file_type.is_symlink() && path.is_dir() {
            warnings.push(format!("{}: symlinked directory not followed", path.display()));
            continue;
        }
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        if !matches!(ext.as_deref(), Some("json" | "yaml" | "yml")) {
            continue;
        }
        // FIFOs, devices and sockets are never opened: reading one could block for ever. (The
        // type is the link target's; a dangling link is left for the read to report.)
        let target = if file_type.is_symlink() {
            std::fs::metadata(&path).ok().map(|m| m.file_type())
        } else {
            Some(file_type)
        };
        match target {
            Some(t) if !t.is_file() => {
                warnings.push(format!(
                    "{}: {}, not a regular file; skipped",
                    path.display(),
                    special_kind(&t)
                ));
            }
            _ => out.push(path),
        }
    }
    Ok(())
}

/// Parses the text of one file. `.json` files are JSON, `.yaml`/`.yml` YAML; other names are
/// sniffed (JSON when the text starts with `{` or `[`).
pub fn parse_text(path: &Path, text: &str) -> Result<Vec<SourcedObject>, SnapshotError> {
    with_json_docs(path, text, |docs| parse_json_docs(path, docs))
}

/// Calls `read` with the documents of the file `path` as JSON text: a JSON file's documents as
/// they are (most files hold one), a YAML file's transcoded.
pub(crate) fn with_json_docs<T>(
    path: &Path,
    text: &str,
    read: impl FnOnce(&[&str]) -> Result<T, SnapshotError>,
) -> Result<T, SnapshotError> {
    if !is_json(path, text) {
        let docs = super::yaml_json::to_json_docs(path, text)?;
        return read(&docs.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let stream = serde_json::Deserializer::from_str(text).into_iter::<&serde_json::value::RawValue>();
    let docs: Vec<&str> = stream.map(|doc| doc.map(|d| d.get())).collect::<Result<_, _>>().map_err(|e| {
        SnapshotError::Json {
            path: path.to_path_buf(),
            line: e.line(),
            column: e.column(),
            message: e
                .to_string()
                .trim_end_matches(&format!(" at line {} column {}", e.line(), e.column()))
                .to_string(),
        }
    })?;
    read(&docs)
}

/// The objects of a file's documents, as JSON text: each is checked against the bounds of
/// [`crate::limits`] on its text before it is parsed into a value.
pub(crate) fn parse_json_docs(path: &Path, docs: &[&str]) -> Result<Vec<SourcedObject>, SnapshotError> {
    let name = path.display().to_string();
    let mut values = Vec::with_capacity(docs.len());
    for (i, doc) in docs.iter().enumerate() {
        let origin = if docs.len() > 1 { format!("{name} doc {}", i + 1) } else { name.clone() };
        super::json_list::check_single(&origin, doc)?;
        // Each document parsed once already (as JSON, or transcoded from YAML).
        values.push(serde_json::from_str(doc).map_err(|e| SnapshotError::Json {
            path: path.to_path_buf(),
            line: 0,
            column: 0,
            message: e.to_string(),
        })?);
    }
    objects_of(&name, values)
}

/// The objects of a file's documents; an error when there are none and no List said so (an
/// empty file, `null` or `[]` is more likely a failed export than an empty cluster).
fn objects_of(name: &str, docs: Vec<Value>) -> Result<Vec<SourcedObject>, SnapshotError> {
    let mut out = Vec::new();
    let saw_list = flatten_docs(name, docs, &mut out)?;
    if out.is_empty() && !saw_list {
        return Err(SnapshotError::Empty { origin: name.to_string() });
    }
    Ok(out)
}

/// Flattens a file's documents (named `doc N` when there are several).
fn flatten_docs(name: &str, docs: Vec<Value>, out: &mut Vec<SourcedObject>) -> Result<bool, SnapshotError> {
    let many = docs.len() > 1;
    let mut saw_list = false;
    for (i, doc) in docs.into_iter().enumerate() {
        let origin = if many { format!("{name} doc {}", i + 1) } else { name.to_string() };
        saw_list |= flatten(origin, doc, out)?;
    }
    Ok(saw_list)
}

/// Expands Lists (`kind: List`, `PodList`, ...) and arrays into their items; drops empty
/// documents. Items of typed lists, which the API server returns without `kind`, get it from
/// the list. Returns whether a well-formed List was seen (a cluster may be empty only so).
/// A List whose `items` is not an array, and a null item, are errors.
fn flatten(origin: String, value: Value, out: &mut Vec<SourcedObject>) -> Result<bool, SnapshotError> {
    let mut saw_list = false;
    match value {
        Value::Null => {}
        Value::Array(items) => {
            for (i, item) in items.into_iter().enumerate() {
                saw_list |= flatten(format!("{origin}[{i}]"), item, out)?;
            }
        }
        Value::Object(mut map) => {
            let kind = map.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
            // A `v1 List` without `items` is refused as one with `items: null` is (kubectl finds
            // no objects in either); other kinds ending in `List` are Lists when they hold items.
            let is_list = kind.ends_with("List") && map.contains_key("items")
                || kind == "List" && map.get("apiVersion").and_then(Value::as_str) == Some("v1");
            if !is_list {
                out.push(SourcedObject::new(origin, Value::Object(map)));
                return Ok(false);
            }
            let item_kind = kind.strip_suffix("List").unwrap_or_default().to_string();
            let api_version = map.get("apiVersion").cloned();
            let items = match map.remove("items") {
                Some(Value::Array(items)) if items.len() > crate::limits::MAX_LIST_ITEMS => {
                    return Err(SnapshotError::NotObjects {
                        origin,
                        reason: format!(
                            "{kind}: items: {} items: at most {} objects in one List",
                            items.len(),
                            crate::limits::MAX_LIST_ITEMS
                        ),
                    })
                }
                Some(Value::Array(items)) => items,
                other => {
                    return Err(SnapshotError::NotObjects {
                        origin,
                        reason: format!(
                            "{kind}: items: {}: a List's items must be an array of objects",
                            other.map_or("missing".to_string(), |v| v.to_string())
                        ),
                    })
                }
            };
            for (i, mut item) in items.into_iter().enumerate() {
                let at = format!("{origin} items[{i}]");
                match &mut item {
                    Value::Object(obj) => {
                        if !item_kind.is_empty() && !obj.contains_key("kind") {
                            obj.insert("kind".into(), Value::String(item_kind.clone()));
                            if let Some(v) = &api_version {
                                obj.entry("apiVersion").or_insert_with(|| v.clone());
                            }
                        }
                    }
                    other => {
                        return Err(SnapshotError::NotObjects {
                            origin: at,
                            reason: format!("{other}: a List item must be an object"),
                        })
                    }
                }
                flatten(at, item, out)?;
            }
            saw_list = true;
        }
        other => out.push(SourcedObject::new(origin, other)),
    }
    Ok(saw_list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_and_typed_lists_are_flattened() {
        let text = r#"{"apiVersion":"v1","kind":"List","items":[
            {"apiVersion":"v1","kind":"Node","metadata":{"name":"a"}},
            {"apiVersion":"v1","kind":"PodList","items":[{"metadata":{"name":"p"}}]}]}"#;
        let objs = parse_text(Path::new("s.json"), text).unwrap();
        assert_eq!(objs.len(), 2);
        assert_eq!(objs[0].origin, "s.json items[0]");
        assert_eq!(objs[1].origin, "s.json items[1] items[0]");
        assert_eq!(objs[1].value["kind"], json!("Pod"));
        assert_eq!(objs[1].value["apiVersion"], json!("v1"));
    }

    #[test]
    fn multi_document_yaml_skips_empty_documents() {
        let text = "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: a\n---\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n";
        let objs = parse_text(Path::new("x.yaml"), text).unwrap();
        assert_eq!(objs.len(), 2);
        assert_eq!(objs[1].value["metadata"]["name"], json!("p"));
        assert!(objs[1].origin.starts_with("x.yaml doc "));
    }

    #[test]
    fn syntax_errors_name_file_and_line() {
        let err = parse_text(Path::new("bad.json"), "{\n  \"a\": 1,\n  \"b\": \n}").unwrap_err();
        match err {
            SnapshotError::Json { line, .. } => assert_eq!(line, 4),
            other => panic!("{other}"),
        }
        let err = parse_text(Path::new("bad.yaml"), "a: 1\nb: [1, 2\nc: 3\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("bad.yaml:"), "{msg}");
        assert!(matches!(err, SnapshotError::Yaml { line, .. } if line >= 2), "{msg}");
    }

    #[test]
    fn unknown_extensions_are_sniffed() {
        let objs = parse_text(Path::new("snap"), "[{\"kind\":\"Node\"}]").unwrap();
        assert_eq!(objs.len(), 1);
        let objs = parse_text(Path::new("snap"), "kind: Node\n").unwrap();
        assert_eq!(objs[0].value["kind"], json!("Node"));
    }
}
