//! An OpenAPI 3.0 document from a service's route table: each [`Operation`] names its method,
//! path, summary, access class, request body schema and answers; the error answers share one
//! schema (the one error shape of [`super::error`]). Services with a richer document of their
//! own (the controller's, from its body specs) add `x-kvplane-access` the same way, so one
//! test can walk every service's document.
//!
//! Knows no service: the tables come from them.

use super::access::{Access, Auth, Policy};
use axum::http::Method;
use serde_json::{json, Map, Value};

/// One operation of a service's API.
#[derive(Clone, Debug)]
pub struct Operation {
    /// The method.
    pub method: Method,
    /// The path, with `{name}` path parameters.
    pub path: &'static str,
    /// One line.
    pub summary: &'static str,
    /// More than one line, if the summary does not say it all.
    pub description: Option<&'static str>,
    /// Who may call it.
    pub access: Access,
    /// The JSON schema of the request body, if it takes one.
    pub body: Option<Value>,
    /// The body may be left out (an empty body means the defaults).
    pub body_optional: bool,
    /// Query parameters: name, JSON schema, required.
    pub query: Vec<(&'static str, Value, bool)>,
    /// The answers besides the errors every route may give: status, description.
    pub answers: Vec<(u16, &'static str)>,
    /// Body schemas of particular answers (a 503 that carries a status document, say).
    pub answer_bodies: Vec<(u16, Value)>,
    /// The schema of this operation's error bodies when it is not the one error shape (the
    /// router's OpenAI routes answer in OpenAI's).
    pub error_body: Option<Value>,
}

impl Operation {
    /// An operation answering 200.
    pub fn new(method: Method, path: &'static str, access: Access, summary: &'static str) -> Self {
        Operation {
            method,
            path,
            summary,
            description: None,
            access,
            body: None,
            body_optional: false,
            query: Vec::new(),
            answers: vec![(200, "OK")],
            answer_bodies: Vec::new(),
            error_body: None,
        }
    }

    /// With a longer description than its summary.
    pub fn describe(mut self, description: &'static str) -> Self {
        self.description = Some(description);
        self
    }

    /// The body of answer `status` follows `schema` (an error status included).
    pub fn answer_body(mut self, status: u16, schema: Value) -> Self {
        self.answer_bodies.push((status, schema));
        self
    }

    /// Every error answer of this operation has a body of `schema` instead of the one error
    /// shape.
    pub fn error_body(mut self, schema: Value) -> Self {
        self.error_body = Some(schema);
        self
    }

    /// With a JSON request body of this schema.
    pub fn body(mut self, schema: Value) -> Self {
        self.body = Some(schema);
        self
    }

    /// With a JSON request body of this schema that may be left out.
    pub fn optional_body(mut self, schema: Value) -> Self {
        self.body = Some(schema);
        self.body_optional = true;
        self
    }

    /// With a query parameter.
    pub fn query(mut self, name: &'static str, schema: Value, required: bool) -> Self {
        self.query.push((name, schema, required));
        self
    }

    /// With these answers instead of 200.
    pub fn answers(mut self, answers: &[(u16, &'static str)]) -> Self {
        self.answers = answers.to_vec();
        self
    }
}

/// The schema of every error body.
pub fn error_schema() -> Value {
    json!({"type": "object", "required": ["detail", "error", "reason"], "properties": {
        "detail": {"description": "FastAPI's: the message, or pydantic's error list"},
        "error": {"type": "string"},
        "reason": {"type": "string"},
        "field": {"type": "string"},
        "index": {"type": "integer"}}})
}

fn answer_with(description: &str, schema: Value) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": schema}}})
}

/// The schema of `op`'s error bodies.
fn error_ref(op: &Operation) -> Value {
    op.error_body
        .clone()
        .unwrap_or_else(|| json!({"$ref": "#/components/schemas/Error"}))
}

/// The document of `operations` for `title`; `auth` marks the operations needing the token.
pub fn document(title: &str, operations: &[Operation], auth: &Auth) -> Value {
    let mut paths = Map::new();
    for op in operations {
        let mut responses = Map::new();
        for (status, description) in &op.answers {
            let body = op.answer_bodies.iter().find(|(s, _)| s == status);
            let answer = match body {
                Some((_, schema)) => answer_with(description, schema.clone()),
                None if *status >= 400 => answer_with(description, error_ref(op)),
                None => json!({ "description": description }),
            };
            responses.insert(status.to_string(), answer);
        }
        // `code`'s error answer, unless the operation's table names its own. The stack's own
        // refusals (token, CSRF guard, limits, unknown routes) are in the one error shape
        // whatever the operation's; the handler's (400, 422) in the operation's.
        let or_error = |responses: &mut Map<String, Value>, code: &str, description: &str| {
            let schema = match code {
                "400" | "422" => error_ref(op),
                _ => json!({"$ref": "#/components/schemas/Error"}),
            };
            responses
                .entry(code.to_owned())
                .or_insert_with(|| answer_with(description, schema));
        };
        or_error(&mut responses, "404", "No such route or object.");
        let mut o = json!({
            "operationId": operation_id(&op.method, op.path),
            "summary": op.summary,
            "x-kvplane-access": op.access.as_str(),
        });
        if let Some(description) = op.description {
            o["description"] = description.into();
        }
        let mut params: Vec<Value> = op
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| {
                json!({"name": name, "in": "path", "required": true,
                       "schema": {"type": "string", "minLength": 1}})
            })
            .collect();
        for (name, schema, required) in &op.query {
            params.push(json!({"name": name, "in": "query", "required": required,
                               "schema": schema}));
        }
        if !params.is_empty() {
            o["parameters"] = Value::Array(params);
        }
        if let Some(schema) = &op.body {
            o["requestBody"] = json!({"required": !op.body_optional,
                "content": {"application/json": {"schema": schema}}});
            or_error(&mut responses, "400", "Not JSON, or a value refused.");
            or_error(
                &mut responses,
                "408",
                "Body not received within --http-read-timeout.",
            );
            or_error(&mut responses, "413", "Body over --max-body-bytes.");
            or_error(
                &mut responses,
                "415",
                "A body not declared as JSON (CSRF guard).",
            );
            or_error(&mut responses, "422", "Body does not match the schema.");
        }
        if !op.method.is_safe() {
            or_error(
                &mut responses,
                "403",
                "Cross-origin browser request (CSRF guard).",
            );
        }
        if auth.requires(op.access) {
            o["security"] = json!([{"bearerAuth": []}]);
            or_error(&mut responses, "401", "Missing or wrong bearer token.");
        }
        o["responses"] = Value::Object(responses);
        let item = paths
            .entry(op.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        item[op.method.as_str().to_ascii_lowercase()] = o;
    }
    let mut components = json!({"schemas": {"Error": error_schema()}});
    if auth.token.is_some() {
        components["securitySchemes"] = json!({"bearerAuth": {"type": "http", "scheme": "bearer"}});
    }
    json!({
        "openapi": "3.0.3",
        "info": {"title": title, "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": components,
    })
}

/// Marks every operation of a document written by hand with its class from `policy`
/// (`x-kvplane-access`) and, where the policy's token settings require it, the bearer
/// security and its 401 answer; declares the scheme when a token is set.
pub fn annotate(doc: &mut Value, policy: &Policy) {
    let auth = policy.auth();
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for (method, op) in item.iter_mut() {
                let Ok(m) = Method::from_bytes(method.to_ascii_uppercase().as_bytes()) else {
                    continue;
                };
                let access = policy.access(&m, path);
                op["x-kvplane-access"] = access.as_str().into();
                if auth.requires(access) {
                    op["security"] = json!([{"bearerAuth": []}]);
                    if let Some(r) = op.get_mut("responses").and_then(Value::as_object_mut) {
                        r.insert(
                            "401".into(),
                            answer_with(
                                "Missing or wrong bearer token.",
                                json!({"$ref": "#/components/schemas/Error"}),
                            ),
                        );
                    }
                }
            }
        }
    }
    if auth.token.is_some() {
        doc["components"]["securitySchemes"] =
            json!({"bearerAuth": {"type": "http", "scheme": "bearer"}});
        doc["components"]["schemas"]["Error"] = error_schema();
    }
}

/// `get_cache_objects` for `GET /cache/objects`.
fn operation_id(method: &Method, path: &str) -> String {
    let mut id = method.as_str().to_ascii_lowercase();
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        id.push('_');
        id.extend(
            seg.chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                .map(|c| c.to_ascii_lowercase()),
        );
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_marks_the_token_routes() {
        let ops = [
            Operation::new(Method::GET, "/healthz", Access::Open, "Liveness"),
            Operation::new(Method::DELETE, "/x/{id}", Access::Write, "Delete")
                .body(json!({"type": "object"})),
        ];
        let doc = document("t", &ops, &Auth::token("s"));
        let del = &doc["paths"]["/x/{id}"]["delete"];
        assert_eq!(del["x-kvplane-access"], "write");
        assert!(del["responses"]["401"].is_object());
        assert_eq!(del["parameters"][0]["name"], "id");
        assert_eq!(del["operationId"], "delete_x_id");
        let get = &doc["paths"]["/healthz"]["get"];
        assert!(get.get("security").is_none());
        assert!(doc["components"]["securitySchemes"]["bearerAuth"].is_object());
        let open = document("t", &ops, &Auth::default());
        assert!(open["paths"]["/x/{id}"]["delete"].get("security").is_none());
    }
}
