//! The HTTP side: URL routing for core and grouped APIs (cluster-scoped, namespaced and
//! all-namespace paths), discovery documents, list/watch/get/create/replace/patch/delete, the
//! status and eviction subresources, fault injection and the request log.

use super::resources::{self as r, RESOURCES};
use super::store::{ApiError, DeleteOptions, EventType, PatchType, Store, Sub};
use super::{RecordedRequest, Shared, REPLICA_HEADER};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::Response;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

type Query = HashMap<String, String>;

fn json_response(code: u16, v: &Value) -> Response {
    let mut resp = Response::new(Body::from(serde_json::to_vec(v).expect("json")));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// The Status answer of an error, with `Retry-After` when it has one.
pub fn error_response(e: &ApiError) -> Response {
    let mut resp = json_response(e.code, &e.status());
    if let Some(ra) = e.retry_after {
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(ra));
    }
    resp
}

fn not_found_path() -> ApiError {
    ApiError::new(404, "NotFound", "the server could not find the requested resource")
}

/// Every request enters here.
pub async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, 64 << 20).await {
        Ok(b) => b,
        Err(e) => return error_response(&ApiError::bad_request(format!("reading the request body: {e}"))),
    };
    let method = parts.method.clone();
    let path = parts.uri.path().to_string();
    let query_str = parts.uri.query().unwrap_or_default().to_string();
    let query: Query = form_urlencoded::parse(query_str.as_bytes()).into_owned().collect();
    let header_str = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let content_type = header_str(header::CONTENT_TYPE.as_str());
    let replica = header_str(REPLICA_HEADER);
    let fault = shared.with(|s, _| {
        if s.closed {
            return Some(ApiError::new(503, "ServiceUnavailable", "the fake apiserver is shutting down"));
        }
        let i = s.faults.iter().position(|f| f.matches(method.as_str(), &path))?;
        let f = &mut s.faults[i];
        f.times -= 1;
        let mut e = ApiError::from_code(f.status, f.message.clone());
        e.retry_after = f.retry_after;
        if f.times == 0 {
            s.faults.remove(i);
        }
        Some(e)
    });
    let resp = match fault {
        Some(e) => error_response(&e),
        None => match route(&shared, &method, &path, &query, content_type.as_deref(), &body).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        },
    };
    let status = resp.status().as_u16();
    tracing::debug!(%method, %path, query = %query_str, status, replica = ?replica, "fake apiserver request");
    shared.with(|s, _| {
        s.requests.push(RecordedRequest {
            method: method.to_string(),
            path,
            query: query_str,
            content_type,
            replica,
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    });
    resp
}

async fn route(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    query: &Query,
    ct: Option<&str>,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let addr = shared.addr.to_string();
    match segs.as_slice() {
        ["version"] => Ok(json_response(
            200,
            &json!({
                "major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "0000000000000000000000000000000000000000",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0",
                "compiler": "gc", "platform": "linux/amd64",
            }),
        )),
        ["healthz"] | ["readyz"] | ["livez"] => {
            let mut resp = Response::new(Body::from("ok"));
            resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            Ok(resp)
        }
        ["api"] => Ok(json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}]}),
        )),
        ["apis"] => {
            let groups: Vec<Value> = r::groups().into_iter().map(|(g, v)| api_group(g, v)).collect();
            Ok(json_response(200, &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})))
        }
        ["api", "v1"] => Ok(json_response(200, &resource_list("", "v1"))),
        ["apis", g] => match r::groups().into_iter().find(|(gg, _)| gg == g) {
            Some((g, v)) => Ok(json_response(200, &api_group(g, v))),
            None => Err(not_found_path()),
        },
        ["apis", g, v] if r::groups().contains(&(*g, *v)) => Ok(json_response(200, &resource_list(g, v))),
        ["api", "v1", rest @ ..] => resource_route(shared, "", "v1", rest, method, query, ct, body).await,
        ["apis", g, v, rest @ ..] => resource_route(shared, g, v, rest, method, query, ct, body).await,
        _ => Err(not_found_path()),
    }
}

fn api_group(g: &str, v: &str) -> Value {
    let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": [gv.clone()], "preferredVersion": gv})
}

fn resource_list(g: &str, v: &str) -> Value {
    let mut resources = Vec::new();
    for rk in RESOURCES.iter().filter(|rk| rk.group == g && rk.version == v) {
        resources.push(json!({
            "name": rk.plural, "singularName": rk.singular, "namespaced": rk.namespaced, "kind": rk.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": rk.short_names,
        }));
        if rk.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", rk.plural), "singularName": "", "namespaced": rk.namespaced,
                "kind": rk.kind, "verbs": ["get", "patch", "update"],
            }));
        }
        if rk.plural == "pods" && g.is_empty() {
            resources.push(json!({
                "name": "pods/binding", "singularName": "", "namespaced": true,
                "kind": "Binding", "verbs": ["create"],
            }));
            resources.push(json!({
                "name": "pods/eviction", "singularName": "", "namespaced": true, "group": "policy",
                "version": "v1", "kind": "Eviction", "verbs": ["create"],
            }));
        }
    }
    let gv = if g.is_empty() { v.to_string() } else { format!("{g}/{v}") };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

#[allow(clippy::too_many_arguments)]
async fn resource_route(
    shared: &Arc<Shared>,
    group: &str,
    version: &str,
    rest: &[&str],
    method: &Method,
    query: &Query,
    ct: Option<&str>,
    body: &Bytes,
) -> Result<Response, ApiError> {
    // `namespaces/{ns}/{plural}/...`, except the namespace object's own subresources.
    let namespaced_path = rest.len() >= 3
        && rest[0] == "namespaces"
        && !(rest.len() == 3 && matches!(rest[2], "status" | "finalize"));
    let (path_ns, rest) = if namespaced_path { (Some(rest[1]), &rest[2..]) } else { (None, rest) };
    let res = r::by_path(group, version, rest[0]).ok_or_else(not_found_path)?;
    let rk = &RESOURCES[res];
    if path_ns.is_some() && !rk.namespaced {
        return Err(not_found_path());
    }
    match rest.len() {
        1 => collection(shared, res, path_ns, method, query, body).await,
        2 | 3 => {
            if rk.namespaced && path_ns.is_none() {
                return Err(not_found_path());
            }
            let ns = path_ns.unwrap_or_default();
            let name = rest[1];
            match rest.get(2).copied() {
                None => object(shared, res, ns, name, Sub::Main, method, query, ct, body),
                Some("status") if rk.status_subresource => {
                    object(shared, res, ns, name, Sub::Status, method, query, ct, body)
                }
                Some("eviction") if res == r::PODS => {
                    if method != Method::POST {
                        return Err(ApiError::method_not_allowed());
                    }
                    let ev: Value = serde_json::from_slice(body)
                        .map_err(|e| ApiError::bad_request(format!("decoding the Eviction: {e}")))?;
                    write(shared, query, |s, now| s.evict(ns, name, &ev, now))?;
                    let mut resp = json_response(
                        201,
                        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                    );
                    // fieldValidation=Warn (the default): unknown fields are dropped with a
                    // warning. kube 5 sends `delete_options`, which the real server ignores.
                    let known = ["apiVersion", "kind", "metadata", "deleteOptions"];
                    for k in ev.as_object().into_iter().flat_map(|o| o.keys()) {
                        if !known.contains(&k.as_str()) {
                            if let Ok(v) =
                                HeaderValue::from_str(&format!("299 - \"unknown field \\\"{k}\\\"\""))
                            {
                                resp.headers_mut().append(header::WARNING, v);
                            }
                        }
                    }
                    Ok(resp)
                }
                Some("binding") if res == r::PODS => {
                    if method != Method::POST {
                        return Err(ApiError::method_not_allowed());
                    }
                    let b: Value = serde_json::from_slice(body)
                        .map_err(|e| ApiError::bad_request(format!("decoding the Binding: {e}")))?;
                    write(shared, query, |s, now| s.bind(ns, name, &b, now))?;
                    Ok(json_response(
                        201,
                        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                    ))
                }
                Some(_) => Err(not_found_path()),
            }
        }
        _ => Err(not_found_path()),
    }
}

/// Runs a write, or with `dryRun=All` runs it on a scratch copy of the store so the answer is
/// the real one (errors included) and nothing is persisted or watched.
fn write<R>(shared: &Arc<Shared>, query: &Query, f: impl FnOnce(&mut Store, Timestamp) -> R) -> R {
    if query.get("dryRun").is_some_and(|v| v == "All") {
        shared.with(|s, now| {
            let mut scratch = s.scratch_copy();
            f(&mut scratch, now)
        })
    } else {
        shared.with(f)
    }
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("decoding the request body: {e}")))
}

fn delete_options(query: &Query, body: &Bytes) -> Result<DeleteOptions, ApiError> {
    let mut opts = if body.iter().all(u8::is_ascii_whitespace) {
        DeleteOptions::default()
    } else {
        DeleteOptions::from_body(&parse_json(body)?)
    };
    if let Some(g) = query.get("gracePeriodSeconds") {
        opts.grace_period_seconds =
            Some(g.parse().map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?);
    }
    Ok(opts)
}

async fn collection(
    shared: &Arc<Shared>,
    res: usize,
    ns: Option<&str>,
    method: &Method,
    query: &Query,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let rk = &RESOURCES[res];
    let q = |k: &str| query.get(k).map(String::as_str);
    match *method {
        Method::GET => {
            let sel = Store::selectors(res, q("labelSelector"), q("fieldSelector"))?;
            if matches!(q("watch"), Some("true" | "1")) {
                return watch(shared, res, ns, sel, query);
            }
            let limit = match q("limit") {
                Some(l) => Some(
                    l.parse::<usize>().map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
                ),
                None => None,
            };
            let cont = q("continue").filter(|c| !c.is_empty());
            let rv = q("resourceVersion").filter(|v| !v.is_empty());
            if cont.is_some() && rv.is_some() {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let page = shared.with(|s, _| {
                if let Some(v) = rv {
                    let n: u64 = v
                        .parse()
                        .map_err(|_| ApiError::bad_request(format!("invalid resource version {v:?}")))?;
                    if n > s.rv {
                        let mut e = ApiError::new(
                            504,
                            "Timeout",
                            format!("Too large resource version: {n}, current: {}", s.rv),
                        );
                        e.retry_after = Some(1);
                        return Err(e);
                    }
                    if q("resourceVersionMatch") == Some("Exact") && n != s.rv && n != 0 {
                        return Err(ApiError::expired(format!("too old resource version: {n} ({})", s.rv)));
                    }
                }
                s.list(res, ns, &sel, limit, cont)
            })?;
            let mut meta = json!({"resourceVersion": page.rv.to_string()});
            if let Some(c) = page.continue_token {
                meta["continue"] = json!(c);
            }
            if let Some(n) = page.remaining {
                meta["remainingItemCount"] = json!(n);
            }
            Ok(json_response(
                200,
                &json!({"kind": rk.list_kind(), "apiVersion": rk.api_version(), "metadata": meta, "items": page.items}),
            ))
        }
        Method::POST => {
            if rk.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed());
            }
            let obj = parse_json(body)?;
            let created = write(shared, query, |s, now| s.create(res, ns, obj, true, now))?;
            Ok(json_response(201, &created))
        }
        Method::DELETE => {
            let sel = Store::selectors(res, q("labelSelector"), q("fieldSelector"))?;
            let opts = delete_options(query, body)?;
            let deleted = write(shared, query, |s, now| -> Result<Vec<Value>, ApiError> {
                let targets: Vec<(String, String)> = s
                    .all(res, ns)
                    .into_iter()
                    .filter(|o| sel.matches(o))
                    .map(|o| {
                        let m = &o["metadata"];
                        (
                            m["namespace"].as_str().unwrap_or_default().to_string(),
                            m["name"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect();
                let mut out = Vec::new();
                for (n, name) in targets {
                    out.push(s.delete(res, &n, &name, &opts, now)?.0);
                }
                Ok(out)
            })?;
            Ok(json_response(
                200,
                &json!({"kind": rk.list_kind(), "apiVersion": rk.api_version(), "metadata": {}, "items": deleted}),
            ))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

#[allow(clippy::too_many_arguments)]
fn object(
    shared: &Arc<Shared>,
    res: usize,
    ns: &str,
    name: &str,
    sub: Sub,
    method: &Method,
    query: &Query,
    ct: Option<&str>,
    body: &Bytes,
) -> Result<Response, ApiError> {
    match *method {
        Method::GET => {
            let obj = shared.with(|s, _| s.get(res, ns, name));
            obj.map(|o| json_response(200, &o)).ok_or_else(|| ApiError::not_found(&RESOURCES[res], name))
        }
        Method::PUT => {
            let obj = parse_json(body)?;
            let stored = write(shared, query, |s, now| s.update(res, ns, name, obj, sub, now))?;
            Ok(json_response(200, &stored))
        }
        Method::PATCH => {
            let ptype = ct.and_then(PatchType::from_content_type).ok_or_else(|| {
                ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of the request was in an unknown format ({}) - accepted media types include: \
                         application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, \
                         application/strategic-merge-patch+json",
                        ct.unwrap_or("no content type")
                    ),
                )
            })?;
            let manager = query.get("fieldManager").map(String::as_str);
            let (stored, created) =
                write(shared, query, |s, now| s.patch(res, ns, name, ptype, body, sub, manager, now))?;
            Ok(json_response(if created { 201 } else { 200 }, &stored))
        }
        Method::DELETE if sub == Sub::Main => {
            let opts = delete_options(query, body)?;
            let (obj, gone) = write(shared, query, |s, now| s.delete(res, ns, name, &opts, now))?;
            Ok(json_response(if gone { 200 } else { 202 }, &obj))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// Decrements the open-watch count when a stream ends or the client goes away.
struct WatchGuard(Arc<Shared>);

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.with(|s, _| s.active_watches = s.active_watches.saturating_sub(1));
    }
}

struct WatchState {
    shared: Arc<Shared>,
    res: usize,
    ns: Option<String>,
    sel: super::selectors::Selectors,
    cursor: u64,
    pending: VecDeque<Bytes>,
    deadline: Instant,
    bookmarks: bool,
    epoch: u64,
    rx: tokio::sync::watch::Receiver<u64>,
    done: bool,
    _guard: WatchGuard,
}

fn line(kind: &str, obj: &Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": obj})).expect("json");
    v.push(b'\n');
    Bytes::from(v)
}

fn bookmark(res: usize, rv: u64, initial_end: bool) -> Bytes {
    let rk = &RESOURCES[res];
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line("BOOKMARK", &json!({"kind": rk.kind, "apiVersion": rk.api_version(), "metadata": meta}))
}

fn watch(
    shared: &Arc<Shared>,
    res: usize,
    ns: Option<&str>,
    sel: super::selectors::Selectors,
    query: &Query,
) -> Result<Response, ApiError> {
    let q = |k: &str| query.get(k).map(String::as_str);
    let bookmarks = matches!(q("allowWatchBookmarks"), Some("true" | "1"));
    let send_initial = matches!(q("sendInitialEvents"), Some("true" | "1"));
    if send_initial && !bookmarks {
        return Err(ApiError::invalid(
            &RESOURCES[res],
            "",
            "allowWatchBookmarks: Required value: sendInitialEvents requires allowWatchBookmarks=true",
        ));
    }
    let timeout = match q("timeoutSeconds") {
        Some(t) => Duration::from_secs(
            t.parse().map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
        ),
        None => Duration::from_secs(1800),
    };
    let cap = shared.with(|s, _| s.settings.watch_timeout_cap);
    let timeout = cap.map_or(timeout, |c| timeout.min(c));
    let rv = q("resourceVersion").filter(|v| !v.is_empty());
    let start = shared.with(|s, _| -> Result<_, ApiError> {
        let mut pending = VecDeque::new();
        let rx = s.notify.subscribe();
        let cursor = match rv {
            None | Some("0") => {
                for o in s.all(res, ns).into_iter().filter(|o| sel.matches(o)) {
                    pending.push_back(line(EventType::Added.as_str(), &o));
                }
                if send_initial {
                    pending.push_back(bookmark(res, s.rv, true));
                }
                s.rv
            }
            Some(v) => {
                let n: u64 = v
                    .parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid resource version {v:?}")))?;
                if send_initial {
                    for o in s.all(res, ns).into_iter().filter(|o| sel.matches(o)) {
                        pending.push_back(line(EventType::Added.as_str(), &o));
                    }
                    pending.push_back(bookmark(res, s.rv, true));
                    s.rv
                } else {
                    n
                }
            }
        };
        s.active_watches += 1;
        Ok((cursor, pending, rx, s.watch_epoch))
    })?;
    let (cursor, pending, rx, epoch) = start;
    let state = WatchState {
        shared: shared.clone(),
        res,
        ns: ns.map(str::to_string),
        sel,
        cursor,
        pending,
        deadline: Instant::now() + timeout,
        bookmarks,
        epoch,
        rx,
        done: false,
        _guard: WatchGuard(shared.clone()),
    };
    let stream = futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(b) = st.pending.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), st));
            }
            if st.done {
                return None;
            }
            // Collect what happened after the cursor, under the lock, marking the wakeup seen
            // while holding it so no write can slip between the scan and the wait.
            let ended = st.shared.with(|s, _| {
                st.rx.borrow_and_update();
                if s.closed || s.watch_epoch != st.epoch {
                    return true;
                }
                if st.cursor < s.compacted {
                    let e = ApiError::expired(format!(
                        "too old resource version: {} ({})",
                        st.cursor, s.compacted
                    ));
                    st.pending.push_back(line("ERROR", &e.status()));
                    s.expired_watches += 1;
                    st.done = true;
                    return false;
                }
                let first = s.history.partition_point(|e| e.rv <= st.cursor);
                for ev in s.history.range(first..) {
                    if let Some((kind, obj)) = Store::event_for(ev, st.res, st.ns.as_deref(), &st.sel) {
                        st.pending.push_back(line(kind.as_str(), &obj));
                    }
                }
                st.cursor = st.cursor.max(s.rv);
                false
            });
            if ended {
                return None;
            }
            if !st.pending.is_empty() {
                continue;
            }
            let interval = st.shared.with(|s, _| s.settings.bookmark_interval);
            let wake = if st.bookmarks { st.deadline.min(Instant::now() + interval) } else { st.deadline };
            tokio::select! {
                changed = st.rx.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                _ = tokio::time::sleep_until(wake) => {
                    if Instant::now() >= st.deadline {
                        return None;
                    }
                    st.pending.push_back(bookmark(st.res, st.cursor, false));
                }
            }
        }
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}
