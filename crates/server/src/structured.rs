//! Structured output requests as each API spells them, read into the engine's
//! `ConstraintSpec`: OpenAI `response_format` (`text`, `json_object`, `json_schema` with its
//! `schema` and `strict`), llama-server's `grammar` (GBNF) and `json_schema`, vLLM's
//! `guided_json` / `guided_regex` / `guided_grammar`, ollama's `format` (`"json"` or a schema).
//! A request may name one constraint; a malformed one is a 400 with the reason (the engine
//! compiles the grammar at submission and reports what is wrong with it).

use crate::error::ApiError;
use quarrel_engine::ConstraintSpec;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

/// The structured-output fields every generation endpoint of the OpenAI API takes besides
/// `response_format` (flattened into the request bodies).
#[derive(Deserialize, ToSchema, Debug, Default, Clone)]
pub struct GuidedFields {
    /// llama-server: a GBNF grammar the output follows.
    pub grammar: Option<String>,
    /// llama-server: a JSON schema the output follows.
    #[schema(value_type = Object)]
    pub json_schema: Option<Value>,
    /// vLLM: a JSON schema (object or JSON text).
    #[schema(value_type = Object)]
    pub guided_json: Option<Value>,
    /// vLLM: a regular expression the whole output matches.
    pub guided_regex: Option<String>,
    /// vLLM: a grammar (GBNF; Lark when it has no `::=`).
    pub guided_grammar: Option<String>,
}

/// A schema given as an object, a boolean, or JSON text.
fn schema_value(field: &str, v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        Value::String(s) => {
            let parsed: Value = serde_json::from_str(s).map_err(|e| ApiError::invalid(format!("{field}: not valid JSON: {e}")))?;
            schema_value(field, &parsed)
        }
        _ => Err(ApiError::invalid(format!("{field} must be a JSON schema object"))),
    }
}

/// A grammar in GBNF (it has `::=`) or llguidance's Lark.
fn grammar_spec(g: &str) -> ConstraintSpec {
    if g.contains("::=") {
        ConstraintSpec::Gbnf(g.to_string())
    } else {
        ConstraintSpec::Lark(g.to_string())
    }
}

/// OpenAI's `response_format`.
pub fn response_format(rf: &Value) -> Result<Option<ConstraintSpec>, ApiError> {
    let kind = match rf.get("type") {
        None => return Err(ApiError::invalid("response_format needs a type: text, json_object or json_schema")),
        Some(Value::String(t)) => t.as_str(),
        Some(_) => return Err(ApiError::invalid("response_format.type must be a string")),
    };
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(ConstraintSpec::JsonObject)),
        "json_schema" => {
            let js = rf.get("json_schema").ok_or_else(|| ApiError::invalid("response_format json_schema needs a json_schema object"))?;
            if !js.is_object() {
                return Err(ApiError::invalid("response_format.json_schema must be an object"));
            }
            if let Some(name) = js.get("name") {
                let ok = name.as_str().is_some_and(|n| {
                    !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                });
                if !ok {
                    return Err(ApiError::invalid("response_format.json_schema.name must be 1-64 letters, digits, '_' or '-'"));
                }
            }
            match js.get("strict") {
                None | Some(Value::Bool(_)) | Some(Value::Null) => {}
                Some(_) => return Err(ApiError::invalid("response_format.json_schema.strict must be a boolean")),
            }
            // strict or not, the schema is enforced token by token
            match js.get("schema") {
                None => Ok(Some(ConstraintSpec::JsonObject)),
                Some(s) => Ok(Some(ConstraintSpec::JsonSchema(schema_value("response_format.json_schema.schema", s)?))),
            }
        }
        other => Err(ApiError::invalid(format!("unknown response_format type {other:?}: use text, json_object or json_schema"))),
    }
}

impl GuidedFields {
    /// The one constraint these fields and `response_format` ask for.
    pub fn spec(&self, response_format: Option<&Value>) -> Result<Option<ConstraintSpec>, ApiError> {
        let mut found: Vec<(&str, ConstraintSpec)> = vec![];
        if let Some(rf) = response_format {
            if let Some(s) = response_format_spec(rf)? {
                found.push(("response_format", s));
            }
        }
        if let Some(g) = &self.grammar {
            found.push(("grammar", grammar_spec(g)));
        }
        if let Some(s) = &self.json_schema {
            found.push(("json_schema", ConstraintSpec::JsonSchema(schema_value("json_schema", s)?)));
        }
        if let Some(s) = &self.guided_json {
            found.push(("guided_json", ConstraintSpec::JsonSchema(schema_value("guided_json", s)?)));
        }
        if let Some(r) = &self.guided_regex {
            found.push(("guided_regex", ConstraintSpec::Regex(r.clone())));
        }
        if let Some(g) = &self.guided_grammar {
            found.push(("guided_grammar", grammar_spec(g)));
        }
        match found.len() {
            0 | 1 => Ok(found.pop().map(|f| f.1)),
            _ => {
                let names: Vec<&str> = found.iter().map(|f| f.0).collect();
                Err(ApiError::invalid(format!("give one structured-output option, not {}", names.join(" and "))))
            }
        }
    }
}

fn response_format_spec(rf: &Value) -> Result<Option<ConstraintSpec>, ApiError> {
    if rf.is_null() {
        return Ok(None);
    }
    response_format(rf)
}

/// ollama's `format`: `"json"`, a JSON schema, or empty.
pub fn ollama_format(format: Option<&Value>) -> Result<Option<ConstraintSpec>, ApiError> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(ConstraintSpec::JsonObject)),
        Some(Value::String(s)) => Err(ApiError::invalid(format!("format must be \"json\" or a JSON schema, got {s:?}"))),
        Some(v @ Value::Object(_)) => Ok(Some(ConstraintSpec::JsonSchema(v.clone()))),
        Some(_) => Err(ApiError::invalid("format must be \"json\" or a JSON schema object")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn response_formats_read_as_the_openai_api_defines_them() {
        assert_eq!(response_format(&json!({"type": "text"})).unwrap(), None);
        assert_eq!(response_format(&json!({"type": "json_object"})).unwrap(), Some(ConstraintSpec::JsonObject));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": schema}});
        assert_eq!(response_format(&rf).unwrap(), Some(ConstraintSpec::JsonSchema(schema.clone())));
        for bad in [
            json!({}),
            json!({"type": 3}),
            json!({"type": "yaml"}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"name": "has space", "schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"strict": "yes", "schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"schema": 5}}),
            json!({"type": "json_schema", "json_schema": {"schema": "{not json"}}),
        ] {
            let e = response_format(&bad).expect_err(&bad.to_string());
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn one_constraint_per_request_from_any_spelling() {
        let g = GuidedFields { grammar: Some("root ::= \"a\"".into()), ..Default::default() };
        assert_eq!(g.spec(None).unwrap(), Some(ConstraintSpec::Gbnf("root ::= \"a\"".into())));
        let g = GuidedFields { guided_grammar: Some("start: \"a\"".into()), ..Default::default() };
        assert_eq!(g.spec(None).unwrap(), Some(ConstraintSpec::Lark("start: \"a\"".into())));
        let g = GuidedFields { guided_json: Some(json!("{\"type\": \"string\"}")), ..Default::default() };
        assert_eq!(g.spec(None).unwrap(), Some(ConstraintSpec::JsonSchema(json!({"type": "string"}))));
        let both = GuidedFields { json_schema: Some(json!({})), ..Default::default() };
        let e = both.spec(Some(&json!({"type": "json_object"}))).unwrap_err();
        assert!(e.message.contains("response_format and json_schema"), "{}", e.message);
        assert_eq!(GuidedFields::default().spec(Some(&json!({"type": "text"}))).unwrap(), None);
    }

    #[test]
    fn ollama_format_is_json_or_a_schema() {
        assert_eq!(ollama_format(None).unwrap(), None);
        assert_eq!(ollama_format(Some(&json!(""))).unwrap(), None);
        assert_eq!(ollama_format(Some(&json!("json"))).unwrap(), Some(ConstraintSpec::JsonObject));
        let s = json!({"type": "object"});
        assert_eq!(ollama_format(Some(&s)).unwrap(), Some(ConstraintSpec::JsonSchema(s.clone())));
        assert!(ollama_format(Some(&json!("xml"))).is_err());
        assert!(ollama_format(Some(&json!(1))).is_err());
    }
}
