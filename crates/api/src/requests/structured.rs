//! Structured output: OpenAI's `response_format`, vLLM's `structured_outputs` and the older
//! `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, read into one
//! [`OutputConstraint`] (at most one per request). Their shapes are checked here; whether a
//! schema, regex or grammar compiles is the server's to say (its grammar engine decides),
//! before generation.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RequestError;
use crate::parse::{type_name, Field};

/// `response_format`: plain text, any JSON object, or JSON that follows a schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// No constraint.
    Text,
    /// A JSON object (any).
    JsonObject,
    /// JSON following `json_schema.schema`.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name (OpenAI requires one; it does not change the output).
    pub name: String,
    /// What the schema is for (does not change the output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema (required here: an object or `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// OpenAI's strict mode. The output is constrained to the schema either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs` object: exactly one of its constraint fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StructuredOutputs {
    /// A JSON schema (an object, or its JSON text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
    /// A regular expression the whole output matches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// The output is one of these strings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice: Option<Vec<String>>,
    /// A Lark (llguidance) grammar.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    /// `true`: any JSON object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_object: Option<bool>,
}

/// The `structured_outputs` keys [`StructuredOutputs`] reads.
const STRUCTURED_KEYS: [&str; 5] = ["json", "regex", "choice", "grammar", "json_object"];

/// What the output is constrained to.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputConstraint {
    /// JSON following this schema (an object or a boolean).
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// Text matching this regular expression.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text of this Lark (llguidance) grammar.
    Grammar(String),
}

/// An [`OutputConstraint`] with the field that asked for it (named by errors about it).
#[derive(Debug, Clone, PartialEq)]
pub struct Constrained {
    /// The field (`response_format`, `structured_outputs.json`, `guided_regex`, ...).
    pub field: String,
    /// The constraint.
    pub constraint: OutputConstraint,
}

/// The structured-output fields of a request, borrowed from it.
#[derive(Debug, Clone, Copy, Default)]
pub struct StructuredFields<'a> {
    /// `response_format`.
    pub response_format: Option<&'a ResponseFormat>,
    /// `structured_outputs`.
    pub structured_outputs: Option<&'a StructuredOutputs>,
    /// `guided_json`.
    pub guided_json: Option<&'a Value>,
    /// `guided_regex`.
    pub guided_regex: Option<&'a String>,
    /// `guided_choice`.
    pub guided_choice: Option<&'a Vec<String>>,
    /// `guided_grammar`.
    pub guided_grammar: Option<&'a String>,
}

/// The wire fields of structured output, for the request types' field lists.
pub(crate) const STRUCTURED_FIELDS: [Field; 6] = [
    Field {
        name: "response_format",
        expected: "{\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \
                   \"json_schema\", \"json_schema\": {\"name\", \"schema\", \"strict\"}}",
    },
    Field {
        name: "structured_outputs",
        expected: "an object with one of json, regex, choice, grammar, json_object",
    },
    Field {
        name: "guided_json",
        expected: "a JSON schema (an object or its JSON text)",
    },
    Field {
        name: "guided_regex",
        expected: "a string",
    },
    Field {
        name: "guided_choice",
        expected: "a list of strings",
    },
    Field {
        name: "guided_grammar",
        expected: "a string",
    },
];

impl StructuredFields<'_> {
    /// The one constraint asked for (`None`: free text), its shape checked: a schema is an
    /// object or a boolean (or, for `guided_json` / `structured_outputs.json`, its JSON text),
    /// a regex or grammar is not empty, a choice list has non-empty strings. Two constraints
    /// in one request are refused, naming both.
    pub fn constraint(&self) -> Result<Option<Constrained>, RequestError> {
        let mut found: Vec<Constrained> = Vec::new();
        let mut add = |field: &str, constraint: OutputConstraint| {
            found.push(Constrained {
                field: field.to_string(),
                constraint,
            })
        };
        match self.response_format {
            None | Some(ResponseFormat::Text) => {}
            Some(ResponseFormat::JsonObject) => {
                add("response_format", OutputConstraint::JsonObject)
            }
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                let field = "response_format.json_schema.schema";
                let schema = json_schema
                    .schema
                    .as_ref()
                    .ok_or_else(|| RequestError::Required {
                        field: field.into(),
                    })?;
                add(
                    "response_format",
                    OutputConstraint::JsonSchema(schema_value(field, schema, false)?),
                );
            }
        }
        if let Some(s) = self.structured_outputs {
            let mut inner = 0;
            if let Some(json) = &s.json {
                let field = "structured_outputs.json";
                add(
                    field,
                    OutputConstraint::JsonSchema(schema_value(field, json, true)?),
                );
                inner += 1;
            }
            if let Some(rx) = &s.regex {
                add(
                    "structured_outputs.regex",
                    OutputConstraint::Regex(non_empty("structured_outputs.regex", rx)?),
                );
                inner += 1;
            }
            if let Some(choice) = &s.choice {
                add(
                    "structured_outputs.choice",
                    OutputConstraint::Choice(choices("structured_outputs.choice", choice)?),
                );
                inner += 1;
            }
            if let Some(g) = &s.grammar {
                add(
                    "structured_outputs.grammar",
                    OutputConstraint::Grammar(non_empty("structured_outputs.grammar", g)?),
                );
                inner += 1;
            }
            if s.json_object == Some(true) {
                add(
                    "structured_outputs.json_object",
                    OutputConstraint::JsonObject,
                );
                inner += 1;
            }
            if inner == 0 {
                return Err(RequestError::invalid(
                    "structured_outputs",
                    format!(
                        "`structured_outputs` must set one of {}",
                        STRUCTURED_KEYS.join(", ")
                    ),
                ));
            }
        }
        if let Some(json) = self.guided_json {
            add(
                "guided_json",
                OutputConstraint::JsonSchema(schema_value("guided_json", json, true)?),
            );
        }
        if let Some(rx) = self.guided_regex {
            add(
                "guided_regex",
                OutputConstraint::Regex(non_empty("guided_regex", rx)?),
            );
        }
        if let Some(choice) = self.guided_choice {
            add(
                "guided_choice",
                OutputConstraint::Choice(choices("guided_choice", choice)?),
            );
        }
        if let Some(g) = self.guided_grammar {
            add(
                "guided_grammar",
                OutputConstraint::Grammar(non_empty("guided_grammar", g)?),
            );
        }
        if let [first, second, ..] = found.as_slice() {
            return Err(RequestError::invalid(
                second.field.clone(),
                format!(
                    "`{}` and `{}` both constrain the output; give at most one",
                    first.field, second.field
                ),
            ));
        }
        Ok(found.pop())
    }
}

/// A schema: an object or a boolean; with `text_ok`, also a string holding one.
fn schema_value(field: &str, v: &Value, text_ok: bool) -> Result<Value, RequestError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        Value::String(s) if text_ok => match serde_json::from_str::<Value>(s) {
            Ok(inner @ (Value::Object(_) | Value::Bool(_))) => Ok(inner),
            Ok(other) => Err(RequestError::invalid(
                field,
                format!(
                    "`{field}` must be a JSON schema (an object), got the text of {}",
                    type_name(&other)
                ),
            )),
            Err(e) => Err(RequestError::invalid(
                field,
                format!("`{field}` is not valid JSON: {e}"),
            )),
        },
        other => Err(RequestError::invalid(
            field,
            format!(
                "`{field}` must be a JSON schema (an object), got {}",
                type_name(other)
            ),
        )),
    }
}

fn non_empty(field: &str, s: &str) -> Result<String, RequestError> {
    if s.is_empty() {
        Err(RequestError::invalid(field, format!("`{field}` is empty")))
    } else {
        Ok(s.to_string())
    }
}

fn choices(field: &str, list: &[String]) -> Result<Vec<String>, RequestError> {
    if list.is_empty() {
        return Err(RequestError::invalid(
            field,
            format!("`{field}` is empty; give at least one choice"),
        ));
    }
    if list.iter().any(String::is_empty) {
        return Err(RequestError::invalid(
            field,
            format!("`{field}` has an empty choice"),
        ));
    }
    Ok(list.to_vec())
}

/// The precise error for `response_format` or `structured_outputs` that did not deserialize,
/// naming the key inside at fault.
pub(crate) fn shape_error(key: &str, value: &Value) -> Option<RequestError> {
    let Value::Object(o) = value else {
        return None;
    };
    match key {
        "response_format" => {
            let kind = o.get("type").and_then(Value::as_str);
            if !matches!(kind, Some("text" | "json_object" | "json_schema")) {
                return Some(RequestError::invalid(
                    "response_format.type",
                    format!(
                        "`response_format.type` must be \"text\", \"json_object\" or \
                         \"json_schema\", got {}",
                        o.get("type").map_or("nothing".into(), crate::parse::show)
                    ),
                ));
            }
            if let Some(k) = o
                .keys()
                .find(|k| !["type", "json_schema"].contains(&k.as_str()))
            {
                return Some(RequestError::UnknownField {
                    field: format!("response_format.{k}"),
                });
            }
            let Some(Value::Object(js)) = o.get("json_schema") else {
                return Some(RequestError::invalid(
                    "response_format.json_schema",
                    "`response_format.json_schema` must be an object with `name` and `schema` \
                     (only with type \"json_schema\")",
                ));
            };
            if let Some(k) = js
                .keys()
                .find(|k| !["name", "description", "schema", "strict"].contains(&k.as_str()))
            {
                return Some(RequestError::UnknownField {
                    field: format!("response_format.json_schema.{k}"),
                });
            }
            Some(RequestError::invalid(
                "response_format.json_schema",
                "`response_format.json_schema` needs a string `name`; `description` is a \
                 string, `strict` true or false",
            ))
        }
        "structured_outputs" => {
            if let Some(k) = o.keys().find(|k| !STRUCTURED_KEYS.contains(&k.as_str())) {
                return Some(RequestError::Unsupported {
                    field: format!("structured_outputs.{k}"),
                    got: crate::parse::show(&o[k]),
                });
            }
            let (k, expected) = [
                ("regex", "a string"),
                ("choice", "a list of strings"),
                ("grammar", "a string"),
                ("json_object", "true or false"),
            ]
            .into_iter()
            .find(|(k, _)| {
                o.get(*k).is_some_and(|v| {
                    let one = serde_json::json!({ *k: v });
                    serde_json::from_value::<StructuredOutputs>(one).is_err()
                })
            })?;
            Some(RequestError::WrongType {
                field: format!("structured_outputs.{k}"),
                expected,
                got: crate::parse::describe(&o[k]),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> Result<Option<Constrained>, RequestError> {
        let rf: Option<ResponseFormat> = v
            .get("response_format")
            .map(|r| serde_json::from_value(r.clone()).expect("response_format"));
        let so: Option<StructuredOutputs> = v
            .get("structured_outputs")
            .map(|r| serde_json::from_value(r.clone()).expect("structured_outputs"));
        let rx = v
            .get("guided_regex")
            .and_then(Value::as_str)
            .map(str::to_string);
        StructuredFields {
            response_format: rf.as_ref(),
            structured_outputs: so.as_ref(),
            guided_json: v.get("guided_json"),
            guided_regex: rx.as_ref(),
            ..StructuredFields::default()
        }
        .constraint()
    }

    #[test]
    fn each_form_reads_into_its_constraint() {
        let schema = json!({"type": "object"});
        let c = read(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": true}}}))
        .expect("ok")
        .expect("some");
        assert_eq!(c.field, "response_format");
        assert_eq!(c.constraint, OutputConstraint::JsonSchema(schema.clone()));
        let c = read(json!({"guided_json": schema.to_string()}))
            .expect("ok")
            .expect("some");
        assert_eq!(c.constraint, OutputConstraint::JsonSchema(schema));
        let c = read(json!({"structured_outputs": {"choice": ["a", "b"]}}))
            .expect("ok")
            .expect("some");
        assert_eq!(c.field, "structured_outputs.choice");
        assert_eq!(read(json!({"response_format": {"type": "text"}})), Ok(None));
    }

    #[test]
    fn two_constraints_or_bad_shapes_are_refused_by_name() {
        let e = read(json!({"response_format": {"type": "json_object"}, "guided_regex": "a+"}))
            .expect_err("two");
        assert_eq!(e.param(), Some("guided_regex"));
        assert!(e.to_string().contains("`response_format`"), "{e}");
        let e = read(json!({"structured_outputs": {"regex": "a", "grammar": "start: \"a\""}}))
            .expect_err("two inside");
        assert_eq!(e.param(), Some("structured_outputs.grammar"));
        let e = read(json!({"guided_json": "[1"})).expect_err("bad text");
        assert_eq!(e.param(), Some("guided_json"));
        let e = read(json!({"guided_json": 3})).expect_err("a number");
        assert!(e.to_string().contains("an integer"), "{e}");
        let e = read(json!({"structured_outputs": {}})).expect_err("empty");
        assert_eq!(e.param(), Some("structured_outputs"));
        let e = read(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x"}}}))
        .expect_err("no schema");
        assert_eq!(e.param(), Some("response_format.json_schema.schema"));
    }

    #[test]
    fn shape_errors_name_the_key_inside() {
        let e = shape_error("response_format", &json!({"type": "yaml"})).expect("error");
        assert_eq!(e.param(), Some("response_format.type"));
        let e = shape_error(
            "response_format",
            &json!({"type": "json_schema", "json_schema": {"name": "x", "schemas": {}}}),
        )
        .expect("error");
        assert_eq!(e.param(), Some("response_format.json_schema.schemas"));
        let e = shape_error("structured_outputs", &json!({"structural_tag": "x"})).expect("e");
        assert_eq!(e.param(), Some("structured_outputs.structural_tag"));
        let e = shape_error("structured_outputs", &json!({"choice": "a"})).expect("e");
        assert_eq!(e.param(), Some("structured_outputs.choice"));
    }
}
