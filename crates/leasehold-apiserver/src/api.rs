//! The HTTP API: discovery documents, Lease CRUD, merge patch, list with selectors, watch.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::response::Response;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KeyValue, TxnOp, WatchOptions,
};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

const GROUP: &str = "coordination.k8s.io";
const GV: &str = "coordination.k8s.io/v1";
const PREFIX: &str = "/registry/leases/";
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Request counters for `/debug/requests`.
#[derive(Default)]
struct Counters {
    total: u64,
    by_verb: BTreeMap<String, u64>,
    in_flight: HashMap<String, u64>,
    max_in_flight: u64,
}

#[derive(Clone)]
struct State {
    etcd: Client,
    counters: Arc<Mutex<Counters>>,
    /// Verbs answered with `403 Forbidden`, as RBAC would without a rule granting them.
    deny: Arc<Vec<String>>,
}

/// Serves the API on `listen` over the etcd at `etcd` until the process ends.
pub(crate) async fn serve(listen: &str, etcd: &str, deny: Vec<String>) -> Result<(), String> {
    let client = Client::connect([etcd], None)
        .await
        .map_err(|e| format!("cannot connect to etcd at {etcd}: {e}"))?;
    let state = State {
        etcd: client,
        counters: Arc::default(),
        deny: Arc::new(deny),
    };
    let app = axum::Router::new().fallback(move |req: Request<Body>| {
        let state = state.clone();
        async move { handle(state, req).await }
    });
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    axum::serve(listener, app)
        .await
        .map_err(|e| format!("serve: {e}"))
}

/// An API error: HTTP code, `Status.reason`, message, and the object it is about.
#[derive(Debug)]
struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
    name: Option<String>,
}

type ApiResult<T> = Result<T, ApiError>;

fn err(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
    ApiError {
        code,
        reason,
        message: message.into(),
        name: None,
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    err(400, "BadRequest", message)
}

fn internal(message: impl std::fmt::Display) -> ApiError {
    err(
        500,
        "InternalError",
        format!("Internal error occurred: {message}"),
    )
}

fn not_found(name: &str) -> ApiError {
    ApiError {
        name: Some(name.to_owned()),
        ..err(
            404,
            "NotFound",
            format!("leases.{GROUP} \"{name}\" not found"),
        )
    }
}

fn conflict(name: &str, why: &str) -> ApiError {
    ApiError {
        name: Some(name.to_owned()),
        ..err(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on leases.{GROUP} \"{name}\": {why}"),
        )
    }
}

const MODIFIED: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

fn json_response(code: u16, body: &Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
}

fn status_object(e: &ApiError) -> Value {
    let mut s = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": e.message,
        "reason": e.reason,
        "code": e.code,
    });
    if let Some(name) = &e.name {
        s["details"] = json!({"name": name, "group": GROUP, "kind": "leases"});
    }
    s
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.code, &status_object(e))
}

/// The query string as a map (last value wins).
fn query(req: &Request<Body>) -> HashMap<String, String> {
    req.uri()
        .query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default()
}

async fn handle(state: State, req: Request<Body>) -> Response {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let method = req.method().clone();
    match (method.clone(), segs.as_slice()) {
        (Method::GET, ["version"]) => json_response(
            200,
            &json!({"major": "1", "minor": "31", "gitVersion": "v1.31.0-leasehold",
                "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "none", "compiler": "none", "platform": "linux/amd64"}),
        ),
        (Method::GET, ["healthz"]) | (Method::GET, ["readyz"]) | (Method::GET, ["livez"]) => {
            Response::new(Body::from("ok"))
        }
        (Method::GET, ["api"]) => json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        ),
        (Method::GET, ["api", "v1"]) => json_response(
            200,
            &json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "events", "singularName": "event", "namespaced": true, "kind": "Event",
                 "verbs": ["list"], "shortNames": ["ev"]}]}),
        ),
        (Method::GET, ["api", "v1", "namespaces", _, "events"])
        | (Method::GET, ["api", "v1", "events"]) => json_response(
            200,
            &json!({"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": "0"}, "items": []}),
        ),
        (Method::GET, ["apis"]) => json_response(
            200,
            &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_doc()]}),
        ),
        (Method::GET, ["apis", GROUP]) => json_response(200, &group_doc()),
        (Method::GET, ["apis", GROUP, "v1"]) => json_response(
            200,
            &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GV,
                "resources": [{"name": "leases", "singularName": "lease", "namespaced": true,
                    "kind": "Lease", "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]}),
        ),
        (Method::GET, ["debug", "requests"]) => {
            let c = state.counters.lock().unwrap_or_else(|e| e.into_inner());
            json_response(
                200,
                &json!({"total": c.total, "byVerb": c.by_verb, "maxInFlightPerLease": c.max_in_flight}),
            )
        }
        (Method::DELETE, ["debug", "requests"]) => {
            let mut c = state.counters.lock().unwrap_or_else(|e| e.into_inner());
            *c = Counters::default();
            json_response(200, &json!({}))
        }
        (_, ["apis", GROUP, "v1", "leases"]) => lease_call(state, req, None, None, method).await,
        (_, ["apis", GROUP, "v1", "namespaces", ns, "leases"]) => {
            let ns = (*ns).to_owned();
            lease_call(state, req, Some(ns), None, method).await
        }
        (_, ["apis", GROUP, "v1", "namespaces", ns, "leases", name]) => {
            let (ns, name) = ((*ns).to_owned(), (*name).to_owned());
            lease_call(state, req, Some(ns), Some(name), method).await
        }
        _ => error_response(&err(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

fn group_doc() -> Value {
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP,
        "versions": [{"groupVersion": GV, "version": "v1"}],
        "preferredVersion": {"groupVersion": GV, "version": "v1"}})
}

/// Counts one Lease request and tracks how many are in flight for its object.
struct InFlight {
    counters: Arc<Mutex<Counters>>,
    key: Option<String>,
}

impl InFlight {
    fn start(counters: &Arc<Mutex<Counters>>, verb: &str, key: Option<String>) -> Self {
        let mut c = counters.lock().unwrap_or_else(|e| e.into_inner());
        c.total += 1;
        *c.by_verb.entry(verb.to_owned()).or_default() += 1;
        if let Some(k) = &key {
            let n = c.in_flight.entry(k.clone()).or_default();
            *n += 1;
            let n = *n;
            c.max_in_flight = c.max_in_flight.max(n);
        }
        InFlight {
            counters: counters.clone(),
            key,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(k) = &self.key {
            let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = c.in_flight.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    c.in_flight.remove(k);
                }
            }
        }
    }
}

async fn lease_call(
    state: State,
    req: Request<Body>,
    ns: Option<String>,
    name: Option<String>,
    method: Method,
) -> Response {
    let q = query(&req);
    let headers = req.headers().clone();
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return error_response(&bad_request(format!("reading the body: {e}"))),
    };
    let watching = matches!(q.get("watch").map(String::as_str), Some("1" | "true"));
    let verb = match (&method, name.is_some(), watching) {
        (&Method::GET, _, true) => "watch",
        (&Method::GET, false, false) => "list",
        (&Method::GET, true, false) => "get",
        (&Method::POST, false, _) => "create",
        (&Method::PUT, true, _) => "update",
        (&Method::PATCH, true, _) => "patch",
        (&Method::DELETE, true, _) => "delete",
        _ => {
            return error_response(&err(
                405,
                "MethodNotAllowed",
                format!(
                    "the server does not allow this method on the requested resource: {method}"
                ),
            ))
        }
    };
    // The object a request is about, for the in-flight count (watches are long-lived: not counted).
    let object = match (&ns, &name, verb) {
        (_, _, "watch") => None,
        (Some(ns), Some(name), _) => Some(format!("{ns}/{name}")),
        (Some(ns), None, "create") => serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["metadata"]["name"].as_str().map(|n| format!("{ns}/{n}"))),
        _ => None,
    };
    let _flight = InFlight::start(&state.counters, verb, object);
    if state.deny.iter().any(|d| d == verb) {
        let what = match &name {
            Some(n) => format!("leases.{GROUP} \"{n}\" is forbidden"),
            None => format!("leases.{GROUP} is forbidden"),
        };
        let scope = match &ns {
            Some(ns) => format!(" in the namespace \"{ns}\""),
            None => " at the cluster scope".into(),
        };
        return error_response(&ApiError {
            name: name.clone(),
            ..err(403, "Forbidden", format!("{what}: User \"system:anonymous\" cannot {verb} resource \"leases\" in API group \"{GROUP}\"{scope}"))
        });
    }
    if let Some(ns) = &ns {
        if let Err(e) = validate_dns_label(ns, "namespace") {
            return error_response(&e);
        }
    }
    let mut etcd = state.etcd.clone();
    let result = match verb {
        "watch" => return watch(etcd, ns, name, &q, &headers).await,
        "list" => list(&mut etcd, ns.as_deref(), &q).await,
        "get" => get(
            &mut etcd,
            ns.as_deref().unwrap_or_default(),
            name.as_deref().unwrap_or_default(),
        )
        .await
        .map(|v| (200, v)),
        "create" => create(&mut etcd, ns.as_deref().unwrap_or_default(), &body).await,
        "update" => {
            update(
                &mut etcd,
                ns.as_deref().unwrap_or_default(),
                name.as_deref().unwrap_or_default(),
                &body,
            )
            .await
        }
        "patch" => {
            patch(
                &mut etcd,
                ns.as_deref().unwrap_or_default(),
                name.as_deref().unwrap_or_default(),
                &headers,
                &body,
            )
            .await
        }
        _ => {
            delete(
                &mut etcd,
                ns.as_deref().unwrap_or_default(),
                name.as_deref().unwrap_or_default(),
                &body,
            )
            .await
        }
    };
    match result {
        Ok((code, v)) if wants_table(&headers) && matches!(verb, "get" | "list") => {
            json_response(code, &table(&v))
        }
        Ok((code, v)) => json_response(code, &v),
        Err(e) => error_response(&e),
    }
}

/// Whether the client asked for server-side printing (`Accept: …;as=Table;…`, as `kubectl get`).
fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table") && a.contains("g=meta.k8s.io"))
}

/// Ages as kubectl prints them (`45s`, `3m12s`, `5h`, `2d3h` …).
fn human_age(secs: u64) -> String {
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    match () {
        _ if secs < 120 => format!("{secs}s"),
        _ if m < 10 && secs.is_multiple_of(60) => format!("{m}m"),
        _ if m < 10 => format!("{m}m{}s", secs % 60),
        _ if h < 3 => format!("{m}m"),
        _ if h < 8 && m % 60 == 0 => format!("{h}h"),
        _ if h < 8 => format!("{h}h{}m", m % 60),
        _ if h < 48 => format!("{h}h"),
        _ if d < 8 && h % 24 == 0 => format!("{d}d"),
        _ if d < 8 => format!("{d}d{}h", h % 24),
        _ => format!("{d}d"),
    }
}

/// A Lease or LeaseList as a `meta.k8s.io/v1` Table: NAME, HOLDER, AGE, as kube-apiserver prints
/// Leases.
fn table(v: &Value) -> Value {
    let items: Vec<&Value> = match v["items"].as_array() {
        Some(items) => items.iter().collect(),
        None => vec![v],
    };
    let now = SystemTime::now();
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let age = o["metadata"]["creationTimestamp"]
                .as_str()
                .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
                .and_then(|t| now.duration_since(t).ok())
                .map(|d| human_age(d.as_secs()))
                .unwrap_or_else(|| "<unknown>".into());
            json!({"cells": [o["metadata"]["name"], o["spec"]["holderIdentity"].as_str().unwrap_or(""), age],
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}})
        })
        .collect();
    let rv = v["metadata"]["resourceVersion"].clone();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv},
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "priority": 0,
             "description": "Name must be unique within a namespace."},
            {"name": "Holder", "type": "string", "format": "", "priority": 0,
             "description": "holderIdentity contains the identity of the holder of a current lease."},
            {"name": "Age", "type": "string", "format": "", "priority": 0,
             "description": "CreationTimestamp is a timestamp representing the server time when this object was created."}],
        "rows": rows})
}

fn validate_dns_label(s: &str, what: &str) -> ApiResult<()> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(err(
            422,
            "Invalid",
            format!("{what} \"{s}\" is invalid: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"),
        ))
    }
}

/// Lease names are DNS-1123 subdomains: `[a-z0-9.-]`, ≤ 253, alphanumeric at both ends.
fn validate_name(name: &str) -> ApiResult<()> {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
        && name.bytes().next().is_some_and(alnum)
        && name.bytes().last().is_some_and(alnum);
    if ok {
        Ok(())
    } else {
        Err(ApiError {
            name: Some(name.to_owned()),
            ..err(
                422,
                "Invalid",
                format!("Lease.{GROUP} \"{name}\" is invalid: metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
            )
        })
    }
}

/// Checks the spec the way Lease validation does.
fn validate_spec(name: &str, obj: &Value) -> ApiResult<()> {
    let spec = &obj["spec"];
    if spec.is_null() {
        return Ok(());
    }
    if !spec.is_object() {
        return Err(bad_request("spec must be an object"));
    }
    for field in ["leaseDurationSeconds", "leaseTransitions"] {
        match &spec[field] {
            Value::Null => {}
            Value::Number(n) if n.as_i64().is_some() => {
                let v = n.as_i64().unwrap_or_default();
                if field == "leaseDurationSeconds" && v <= 0 || v < 0 || v > i64::from(i32::MAX) {
                    return Err(ApiError {
                        name: Some(name.to_owned()),
                        ..err(422, "Invalid", format!("Lease.{GROUP} \"{name}\" is invalid: spec.{field}: Invalid value: {v}: must be greater than {}", if field == "leaseDurationSeconds" { "0" } else { "or equal to 0" }))
                    });
                }
            }
            _ => return Err(bad_request(format!("spec.{field} must be an integer"))),
        }
    }
    for field in ["acquireTime", "renewTime"] {
        match &spec[field] {
            Value::Null => {}
            Value::String(s) if humantime::parse_rfc3339_weak(s).is_ok() => {}
            other => {
                return Err(bad_request(format!(
                    "spec.{field}: cannot parse {other} as a MicroTime (RFC 3339)"
                )))
            }
        }
    }
    if let Some(h) = spec.get("holderIdentity") {
        if !(h.is_null() || h.is_string()) {
            return Err(bad_request("spec.holderIdentity must be a string"));
        }
    }
    Ok(())
}

fn etcd_key(ns: &str, name: &str) -> String {
    format!("{PREFIX}{ns}/{name}")
}

/// The object stored in `kv`, with its resourceVersion set from the modification revision.
fn decode(kv: &KeyValue, rv: i64) -> ApiResult<Value> {
    let mut v: Value = serde_json::from_slice(kv.value()).map_err(internal)?;
    if !v.is_object() || !v["metadata"].is_object() {
        return Err(internal(
            "a stored object is not a JSON object with metadata",
        ));
    }
    v["metadata"]["resourceVersion"] = Value::String(rv.to_string());
    Ok(v)
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

fn new_uid() -> String {
    let h = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    format!(
        "{}-{}-4{}-{}{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        ["8", "9", "a", "b"][fastrand::usize(..4)],
        &h[17..20],
        &h[20..32]
    )
}

fn parse_object(body: &Bytes) -> ApiResult<Value> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        bad_request(format!(
            "the body of the request was in an unknown format: {e}"
        ))
    })?;
    if !v.is_object() {
        return Err(bad_request("the body must be a JSON object"));
    }
    if let Some(k) = v.get("kind").and_then(Value::as_str) {
        if k != "Lease" {
            return Err(bad_request(format!("the kind {k:?} does not match Lease")));
        }
    }
    if let Some(a) = v.get("apiVersion").and_then(Value::as_str) {
        if a != GV {
            return Err(bad_request(format!(
                "the apiVersion {a:?} does not match {GV}"
            )));
        }
    }
    if !(v["metadata"].is_null() || v["metadata"].is_object()) {
        return Err(bad_request("metadata must be an object"));
    }
    Ok(v)
}

/// Prepares an object for storage: kind, apiVersion, namespace set; resourceVersion dropped.
fn normalise(mut obj: Value, ns: &str) -> ApiResult<Value> {
    if !obj.is_object() || !(obj["metadata"].is_null() || obj["metadata"].is_object()) {
        return Err(bad_request(
            "the object and its metadata must be JSON objects",
        ));
    }
    obj["kind"] = json!("Lease");
    obj["apiVersion"] = json!(GV);
    if obj["metadata"].is_null() {
        obj["metadata"] = json!({});
    }
    match obj["metadata"].get("namespace").and_then(Value::as_str) {
        Some(n) if n != ns => return Err(bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => obj["metadata"]["namespace"] = json!(ns),
    }
    if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("resourceVersion");
        m.remove("selfLink");
    }
    Ok(obj)
}

async fn get(etcd: &mut Client, ns: &str, name: &str) -> ApiResult<Value> {
    let r = etcd.get(etcd_key(ns, name), None).await.map_err(internal)?;
    match r.kvs().first() {
        Some(kv) => decode(kv, kv.mod_revision()),
        None => Err(not_found(name)),
    }
}

async fn create(etcd: &mut Client, ns: &str, body: &Bytes) -> ApiResult<(u16, Value)> {
    let mut obj = normalise(parse_object(body)?, ns)?;
    let mut name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if name.is_empty() {
        if let Some(g) = obj["metadata"]["generateName"].as_str() {
            let suffix: String = (0..5)
                .map(|_| char::from(b"bcdfghjklmnpqrstvwxz2456789"[fastrand::usize(..27)]))
                .collect();
            name = format!("{g}{suffix}");
        } else {
            return Err(err(
                422,
                "Invalid",
                format!("Lease.{GROUP} \"\" is invalid: metadata.name: Required value: name or generateName is required"),
            ));
        }
    }
    validate_name(&name)?;
    validate_spec(&name, &obj)?;
    obj["metadata"]["name"] = json!(name);
    obj["metadata"]["uid"] = json!(new_uid());
    obj["metadata"]["creationTimestamp"] = json!(now_rfc3339());
    let key = etcd_key(ns, &name);
    let txn = etcd_client::Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key, obj.to_string(), None)]);
    let r = etcd.txn(txn).await.map_err(internal)?;
    if !r.succeeded() {
        return Err(ApiError {
            name: Some(name.clone()),
            ..err(
                409,
                "AlreadyExists",
                format!("leases.{GROUP} \"{name}\" already exists"),
            )
        });
    }
    let rv = r.header().map(|h| h.revision()).unwrap_or_default();
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    Ok((201, obj))
}

fn parse_rv(rv: &str) -> ApiResult<i64> {
    rv.parse::<i64>().ok().filter(|v| *v > 0).ok_or_else(|| {
        bad_request(format!(
            "invalid resourceVersion {rv:?}: must be a positive integer"
        ))
    })
}

/// Writes `obj` over the current object if its modification revision is still `rv`.
async fn put_if(etcd: &mut Client, key: &str, obj: &Value, rv: i64) -> ApiResult<Option<i64>> {
    let txn = etcd_client::Txn::new()
        .when([Compare::mod_revision(key, CompareOp::Equal, rv)])
        .and_then([TxnOp::put(key, obj.to_string(), None)]);
    let r = etcd.txn(txn).await.map_err(internal)?;
    Ok(r.succeeded()
        .then(|| r.header().map(|h| h.revision()).unwrap_or_default()))
}

/// Reads, lets `f` build the new object from the current one, writes on the revision read; a
/// write that loses the race is retried unless the caller gave a resourceVersion.
async fn guaranteed_update(
    etcd: &mut Client,
    ns: &str,
    name: &str,
    precondition: Option<i64>,
    mut f: impl FnMut(&Value) -> ApiResult<Value>,
) -> ApiResult<(u16, Value)> {
    let key = etcd_key(ns, name);
    loop {
        let current = get(etcd, ns, name).await?;
        let cur_rv = parse_rv(
            current["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default(),
        )?;
        if let Some(p) = precondition {
            if p != cur_rv {
                return Err(conflict(name, MODIFIED));
            }
        }
        let mut next = normalise(f(&current)?, ns)?;
        if next["metadata"]["name"].as_str() != Some(name) {
            return Err(bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                next["metadata"]["name"]
            )));
        }
        validate_spec(name, &next)?;
        // Server-owned fields come from the stored object.
        for f in ["uid", "creationTimestamp"] {
            next["metadata"][f] = current["metadata"][f].clone();
        }
        match put_if(etcd, &key, &next, cur_rv).await? {
            Some(rv) => {
                next["metadata"]["resourceVersion"] = json!(rv.to_string());
                return Ok((200, next));
            }
            None if precondition.is_some() => return Err(conflict(name, MODIFIED)),
            None => continue,
        }
    }
}

async fn update(etcd: &mut Client, ns: &str, name: &str, body: &Bytes) -> ApiResult<(u16, Value)> {
    let obj = parse_object(body)?;
    if obj["metadata"]["name"].as_str() != Some(name) {
        return Err(bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            obj["metadata"]["name"]
        )));
    }
    let precondition = match obj["metadata"]["resourceVersion"].as_str() {
        None | Some("") => None,
        Some(rv) => Some(parse_rv(rv)?),
    };
    if let Some(uid) = obj["metadata"]["uid"].as_str() {
        let current = get(etcd, ns, name).await?;
        if current["metadata"]["uid"].as_str() != Some(uid) {
            return Err(conflict(
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current["metadata"]["uid"].as_str().unwrap_or_default()
                ),
            ));
        }
    }
    guaranteed_update(etcd, ns, name, precondition, |_| Ok(obj.clone())).await
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

async fn patch(
    etcd: &mut Client,
    ns: &str,
    name: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> ApiResult<(u16, Value)> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let ct = ct.split(';').next().unwrap_or_default().trim();
    if ct != "application/merge-patch+json" && ct != "application/strategic-merge-patch+json" {
        return Err(err(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json (got {ct:?})"),
        ));
    }
    let p: Value = serde_json::from_slice(body).map_err(|e| {
        bad_request(format!(
            "the body of the request was in an unknown format: {e}"
        ))
    })?;
    if !p.is_object() {
        return Err(bad_request("a merge patch must be a JSON object"));
    }
    let precondition = match p["metadata"]["resourceVersion"].as_str() {
        None | Some("") => None,
        Some(rv) => Some(parse_rv(rv)?),
    };
    guaranteed_update(etcd, ns, name, precondition, |cur| {
        let mut next = cur.clone();
        merge_patch(&mut next, &p);
        Ok(next)
    })
    .await
}

async fn delete(etcd: &mut Client, ns: &str, name: &str, body: &Bytes) -> ApiResult<(u16, Value)> {
    let opts: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(body)
            .map_err(|e| bad_request(format!("the DeleteOptions body does not parse: {e}")))?
    };
    let pre_rv = match opts["preconditions"]["resourceVersion"].as_str() {
        None | Some("") => None,
        Some(rv) => Some(parse_rv(rv)?),
    };
    let pre_uid = opts["preconditions"]["uid"].as_str().map(str::to_owned);
    let key = etcd_key(ns, name);
    loop {
        let current = get(etcd, ns, name).await?;
        let cur_rv = parse_rv(
            current["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default(),
        )?;
        if let Some(p) = pre_rv {
            if p != cur_rv {
                return Err(conflict(
                    name,
                    &format!("Precondition failed: ResourceVersion in precondition: {p}, ResourceVersion in object meta: {cur_rv}"),
                ));
            }
        }
        if let Some(uid) = &pre_uid {
            let have = current["metadata"]["uid"].as_str().unwrap_or_default();
            if uid != have {
                return Err(conflict(
                    name,
                    &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"),
                ));
            }
        }
        let txn = etcd_client::Txn::new()
            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, cur_rv)])
            .and_then([TxnOp::delete(key.clone(), None)]);
        let r = etcd.txn(txn).await.map_err(internal)?;
        if r.succeeded() {
            return Ok((200, current));
        }
        if pre_rv.is_some() {
            return Err(conflict(name, MODIFIED));
        }
    }
}

/// A parsed label selector: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`.
#[derive(Debug)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

fn split_selector(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn parse_selector(s: &str) -> ApiResult<Vec<Req>> {
    let bad = || {
        bad_request(format!(
            "unable to parse requirement in label selector {s:?}"
        ))
    };
    let set = |v: &str| -> ApiResult<Vec<String>> {
        let v = v.trim();
        let inner = v
            .strip_prefix('(')
            .and_then(|v| v.strip_suffix(')'))
            .ok_or_else(bad)?;
        Ok(inner.split(',').map(|x| x.trim().to_owned()).collect())
    };
    let mut reqs = Vec::new();
    for part in split_selector(s) {
        let r = if let Some((k, v)) = part.split_once("!=") {
            Req::Ne(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = part.split_once("==") {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = part.split_once('=') {
            Req::Eq(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = part.split_once(" notin ") {
            Req::NotIn(k.trim().into(), set(v)?)
        } else if let Some((k, v)) = part.split_once(" in ") {
            Req::In(k.trim().into(), set(v)?)
        } else if let Some(k) = part.strip_prefix('!') {
            Req::NotExists(k.trim().into())
        } else {
            Req::Exists(part.clone())
        };
        let key = match &r {
            Req::Eq(k, _)
            | Req::Ne(k, _)
            | Req::Exists(k)
            | Req::NotExists(k)
            | Req::In(k, _)
            | Req::NotIn(k, _) => k,
        };
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(bad());
        }
        reqs.push(r);
    }
    Ok(reqs)
}

fn labels_match(obj: &Value, reqs: &[Req]) -> bool {
    let labels = &obj["metadata"]["labels"];
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    reqs.iter().all(|r| match r {
        Req::Eq(k, v) => get(k) == Some(v.as_str()),
        Req::Ne(k, v) => get(k) != Some(v.as_str()),
        Req::Exists(k) => get(k).is_some(),
        Req::NotExists(k) => get(k).is_none(),
        Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
        Req::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
    })
}

/// Field selectors on `metadata.name` and `metadata.namespace` (`=`, `==`, `!=`).
fn parse_fields(s: &str) -> ApiResult<Vec<(String, bool, String)>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
            (k, false, v)
        } else if let Some((k, v)) = part.split_once("==") {
            (k, true, v)
        } else if let Some((k, v)) = part.split_once('=') {
            (k, true, v)
        } else {
            return Err(bad_request(format!("invalid field selector {part:?}")));
        };
        if k != "metadata.name" && k != "metadata.namespace" {
            return Err(bad_request(format!(
                "field label not supported: {k} (only metadata.name and metadata.namespace)"
            )));
        }
        out.push((k.to_owned(), eq, v.to_owned()));
    }
    Ok(out)
}

fn fields_match(obj: &Value, fields: &[(String, bool, String)]) -> bool {
    fields.iter().all(|(k, eq, v)| {
        let field = k.trim_start_matches("metadata.");
        (obj["metadata"][field].as_str() == Some(v.as_str())) == *eq
    })
}

struct Filter {
    labels: Vec<Req>,
    fields: Vec<(String, bool, String)>,
}

impl Filter {
    fn from_query(q: &HashMap<String, String>) -> ApiResult<Self> {
        Ok(Filter {
            labels: parse_selector(q.get("labelSelector").map(String::as_str).unwrap_or(""))?,
            fields: parse_fields(q.get("fieldSelector").map(String::as_str).unwrap_or(""))?,
        })
    }

    fn matches(&self, obj: &Value) -> bool {
        labels_match(obj, &self.labels) && fields_match(obj, &self.fields)
    }
}

fn range_prefix(ns: Option<&str>) -> String {
    match ns {
        Some(ns) => format!("{PREFIX}{ns}/"),
        None => PREFIX.to_owned(),
    }
}

/// The matching objects and the store revision they were read at.
async fn read_all(
    etcd: &mut Client,
    ns: Option<&str>,
    filter: &Filter,
) -> ApiResult<(Vec<Value>, i64)> {
    let r = etcd
        .get(range_prefix(ns), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(internal)?;
    let rev = r.header().map(|h| h.revision()).unwrap_or_default();
    let mut items = Vec::new();
    for kv in r.kvs() {
        let obj = decode(kv, kv.mod_revision())?;
        if filter.matches(&obj) {
            items.push(obj);
        }
    }
    Ok((items, rev))
}

async fn list(
    etcd: &mut Client,
    ns: Option<&str>,
    q: &HashMap<String, String>,
) -> ApiResult<(u16, Value)> {
    let filter = Filter::from_query(q)?;
    let (items, rev) = read_all(etcd, ns, &filter).await?;
    Ok((
        200,
        json!({"kind": "LeaseList", "apiVersion": GV,
            "metadata": {"resourceVersion": rev.to_string()}, "items": items}),
    ))
}

fn watch_line(kind: &str, obj: &Value) -> Bytes {
    let mut s = json!({"type": kind, "object": obj}).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn error_event(code: u16, reason: &'static str, message: String) -> Bytes {
    watch_line("ERROR", &status_object(&err(code, reason, message)))
}

async fn watch(
    mut etcd: Client,
    ns: Option<String>,
    name: Option<String>,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Response {
    let as_table = wants_table(headers);
    let line = move |kind: &str, obj: &Value| {
        if as_table {
            watch_line(kind, &table(obj))
        } else {
            watch_line(kind, obj)
        }
    };
    let mut filter = match Filter::from_query(q) {
        Ok(f) => f,
        Err(e) => return error_response(&e),
    };
    if let Some(name) = &name {
        filter
            .fields
            .push(("metadata.name".into(), true, name.clone()));
    }
    let rv = q.get("resourceVersion").cloned().unwrap_or_default();
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    // With no resourceVersion (or "0") the current objects come first as ADDED events.
    let start = if rv.is_empty() || rv == "0" {
        let (items, rev) = match read_all(&mut etcd, ns.as_deref(), &filter).await {
            Ok(x) => x,
            Err(e) => return error_response(&e),
        };
        for obj in items {
            let _ = tx.try_send(line("ADDED", &obj));
        }
        rev + 1
    } else {
        match parse_rv(&rv) {
            Ok(r) => r + 1,
            Err(e) => return error_response(&e),
        }
    };
    let opts = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_start_revision(start);
    let stream = etcd.watch(range_prefix(ns.as_deref()), Some(opts)).await;
    let mut stream = match stream {
        Ok(s) => s,
        Err(e) => return error_response(&internal(e)),
    };
    tokio::spawn(async move {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            let next = async {
                match deadline {
                    Some(d) => tokio::time::timeout_at(d, stream.message()).await.ok(),
                    None => Some(stream.message().await),
                }
            };
            let msg = tokio::select! {
                m = next => m,
                () = tx.closed() => return,
            };
            let msg = match msg {
                None | Some(Ok(None)) => return,
                Some(Err(e)) => {
                    let _ = tx
                        .send(error_event(500, "InternalError", e.to_string()))
                        .await;
                    return;
                }
                Some(Ok(Some(m))) => m,
            };
            if msg.compact_revision() > 0 || (msg.canceled() && msg.events().is_empty()) {
                let _ = tx
                    .send(error_event(
                        410,
                        "Expired",
                        format!(
                            "too old resource version: {} ({})",
                            start - 1,
                            msg.compact_revision()
                        ),
                    ))
                    .await;
                return;
            }
            for ev in msg.events() {
                let line = match ev.event_type() {
                    EventType::Put => {
                        let Some(kv) = ev.kv() else { continue };
                        let Ok(obj) = decode(kv, kv.mod_revision()) else {
                            continue;
                        };
                        if !filter.matches(&obj) {
                            continue;
                        }
                        let kind = if kv.create_revision() == kv.mod_revision() {
                            "ADDED"
                        } else {
                            "MODIFIED"
                        };
                        line(kind, &obj)
                    }
                    EventType::Delete => {
                        let (Some(prev), Some(kv)) = (ev.prev_kv(), ev.kv()) else {
                            continue;
                        };
                        let Ok(obj) = decode(prev, kv.mod_revision()) else {
                            continue;
                        };
                        if !filter.matches(&obj) {
                            continue;
                        }
                        line("DELETED", &obj)
                    }
                };
                if tx.send(line).await.is_err() {
                    return;
                }
            }
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<Bytes, std::io::Error>(b), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(body))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
    }

    #[test]
    fn selectors_parse_and_match() {
        let obj = json!({"metadata": {"labels": {"app": "x", "tier": "db"}}});
        let m = |s: &str| labels_match(&obj, &parse_selector(s).unwrap());
        assert!(m("app=x"));
        assert!(m("app==x,tier"));
        assert!(!m("app!=x"));
        assert!(m("tier in (db, web)"));
        assert!(!m("tier notin (db)"));
        assert!(m("!missing"));
        assert!(!m("missing"));
        assert!(parse_selector("a b").is_err());
    }

    #[test]
    fn ages_print_like_kubectl() {
        assert_eq!(human_age(45), "45s");
        assert_eq!(human_age(192), "3m12s");
        assert_eq!(human_age(3 * 3600 + 60), "3h1m");
        assert_eq!(human_age(5 * 86400), "5d");
    }

    #[test]
    fn names_are_validated() {
        assert!(validate_name("task-llm-x.y").is_ok());
        assert!(validate_name("Bad").is_err());
        assert!(validate_name("-x").is_err());
        assert!(validate_name("").is_err());
        assert!(validate_name(&"a".repeat(254)).is_err());
    }
}
