//! Tool-call parsers (`--tool-call-parser`): find the calls in a generation's content and turn
//! them into OpenAI tool calls, streaming.
//!
//! | format | a call |
//! |---|---|
//! | `poolside_v1` (Laguna, as GLM-4.5) | `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>` |
//! | `hermes` (Hermes, Qwen2.5) | `<tool_call>{"name": N, "arguments": {…}}</tool_call>` |
//! | `qwen3_coder` | `<tool_call><function=NAME><parameter=K>V</parameter>…</function></tool_call>` |
//! | `llama3_json` (Llama 3.1) | the whole output is `{"name": N, "parameters": {…}}` (after `<\|python_tag\|>`; several joined by `;`) |
//!
//! Values of the XML-ish formats are text; they become the JSON type the tool's parameter schema
//! names (string as is; integer, number, boolean; object and array parsed as JSON), as vLLM's
//! parsers convert them. Arguments are written as Python's `json.dumps` writes them (what vLLM
//! returns). Text outside calls is content; a call that does not parse is left in the content
//! as it was written. A call's id and name go out as soon as the name is complete, its arguments
//! when the call is.

use serde_json::{Map, Value};

use super::Event;
use crate::text::partial_match_len;

/// The tool-call formats, named as vLLM's `--tool-call-parser` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Laguna (poolside): GLM-style `<arg_key>` / `<arg_value>` pairs.
    PoolsideV1,
    /// Hermes / Qwen2.5: JSON in `<tool_call>`.
    Hermes,
    /// Qwen3-Coder: XML `<function=…>` / `<parameter=…>`.
    Qwen3Coder,
    /// Llama 3.1: bare JSON.
    Llama3Json,
}

impl ToolFormat {
    /// Every format with its flag value.
    pub const ALL: [(&'static str, ToolFormat); 4] = [
        ("poolside_v1", Self::PoolsideV1),
        ("hermes", Self::Hermes),
        ("qwen3_coder", Self::Qwen3Coder),
        ("llama3_json", Self::Llama3Json),
    ];

    /// The format of a flag value, if there is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }

    /// The format a chat template's tool-call instructions use, if one of these.
    pub fn detect(template: &str) -> Option<Self> {
        if template.contains("<arg_key>") {
            Some(Self::PoolsideV1)
        } else if template.contains("<function=") && template.contains("<parameter=") {
            Some(Self::Qwen3Coder)
        } else if template.contains("<tool_call>") {
            Some(Self::Hermes)
        } else if template.contains("<|python_tag|>") || template.contains("\"parameters\"") {
            Some(Self::Llama3Json)
        } else {
            None
        }
    }
}

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

/// Where the splitter is.
#[derive(Debug)]
enum State {
    /// Outside calls (for `llama3_json`: not yet known whether the output is a call).
    Outside,
    /// Inside `<tool_call>`: the body so far, and whether the header went out.
    Inside { body: String, announced: bool },
    /// `llama3_json`: the whole output is a call; collected until the end.
    Whole(String),
    /// `llama3_json`: the output is not a call; all of it is content.
    Plain,
}

/// One tool call, complete.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCall {
    /// Its id (`chatcmpl-tool-…`).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// Its arguments, a JSON object's text.
    pub arguments: String,
}

/// Finds tool calls in one generation's content, piece by piece.
#[derive(Debug)]
pub(crate) struct ToolCallSplitter {
    format: ToolFormat,
    /// The request's tool definitions (their parameter schemas type the values).
    tools: Vec<Value>,
    state: State,
    pending: String,
    /// Calls started so far (the next call's index).
    calls: usize,
    /// The id of the call being read.
    id: String,
    /// Makes ids.
    new_id: fn() -> String,
}

impl ToolCallSplitter {
    /// A splitter for `format` with the request's `tools`; `new_id` makes call ids.
    pub fn new(format: ToolFormat, tools: Vec<Value>, new_id: fn() -> String) -> Self {
        Self {
            format,
            tools,
            state: State::Outside,
            pending: String::new(),
            calls: 0,
            id: String::new(),
            new_id,
        }
    }

    /// Whether any call was found.
    pub fn called(&self) -> bool {
        self.calls > 0
    }

    /// Splits `text` (the next piece of content).
    pub fn push(&mut self, text: &str, out: &mut Vec<Event>) {
        self.pending.push_str(text);
        loop {
            match &mut self.state {
                State::Whole(all) => {
                    all.push_str(&std::mem::take(&mut self.pending));
                    return;
                }
                State::Outside if self.format == ToolFormat::Llama3Json => {
                    let trimmed = self.pending.trim_start();
                    if trimmed.starts_with('{') || trimmed.starts_with(PYTHON_TAG) {
                        self.state = State::Whole(std::mem::take(&mut self.pending));
                    } else if trimmed.is_empty() || PYTHON_TAG.starts_with(trimmed) {
                        return;
                    } else {
                        self.state = State::Plain;
                    }
                }
                State::Plain => {
                    let rest = std::mem::take(&mut self.pending);
                    if !rest.is_empty() {
                        out.push(Event::Content(rest));
                    }
                    return;
                }
                State::Outside => match self.pending.find(START) {
                    Some(at) => {
                        if at > 0 {
                            out.push(Event::Content(self.pending[..at].to_string()));
                        }
                        self.pending.drain(..at + START.len());
                        self.state = State::Inside {
                            body: String::new(),
                            announced: false,
                        };
                    }
                    None => {
                        let keep = partial_match_len(&self.pending, START);
                        let ready: String =
                            self.pending.drain(..self.pending.len() - keep).collect();
                        if !ready.is_empty() {
                            out.push(Event::Content(ready));
                        }
                        return;
                    }
                },
                State::Inside { body, announced } => {
                    body.push_str(&std::mem::take(&mut self.pending));
                    let Some(at) = body.find(END) else {
                        if !*announced {
                            if let Some(name) = early_name(self.format, body) {
                                *announced = true;
                                self.id = (self.new_id)();
                                out.push(Event::ToolCall {
                                    index: self.calls,
                                    id: self.id.clone(),
                                    name,
                                });
                            }
                        }
                        return;
                    };
                    let rest = body[at + END.len()..].to_string();
                    body.truncate(at);
                    let (body, announced) = (std::mem::take(body), *announced);
                    self.close_call(&body, announced, out);
                    self.state = State::Outside;
                    self.pending = rest;
                }
            }
        }
    }

    /// Emits the call whose body is complete (or, if it does not parse and nothing was
    /// announced, its text as content).
    fn close_call(&mut self, body: &str, announced: bool, out: &mut Vec<Event>) {
        match parse_call(self.format, body, &self.tools) {
            Some((name, arguments)) => {
                if !announced {
                    self.id = (self.new_id)();
                    out.push(Event::ToolCall {
                        index: self.calls,
                        id: self.id.clone(),
                        name,
                    });
                }
                out.push(Event::ToolArgs {
                    index: self.calls,
                    fragment: arguments,
                });
                self.calls += 1;
            }
            None if announced => {
                // The name went out; the arguments did not parse: an empty object.
                out.push(Event::ToolArgs {
                    index: self.calls,
                    fragment: "{}".into(),
                });
                self.calls += 1;
            }
            None => out.push(Event::Content(format!("{START}{body}{END}"))),
        }
    }

    /// The end of the generation.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        match std::mem::replace(&mut self.state, State::Outside) {
            State::Whole(all) => {
                let all = all + &std::mem::take(&mut self.pending);
                match parse_llama_calls(&all) {
                    Some(calls) => {
                        for (name, arguments) in calls {
                            out.push(Event::ToolCall {
                                index: self.calls,
                                id: (self.new_id)(),
                                name,
                            });
                            out.push(Event::ToolArgs {
                                index: self.calls,
                                fragment: arguments,
                            });
                            self.calls += 1;
                        }
                    }
                    None => out.push(Event::Content(all)),
                }
            }
            State::Inside { body, announced } => {
                // Cut off inside a call (e.g. by max_tokens): emit it if it reads.
                let body = body + &std::mem::take(&mut self.pending);
                if announced || parse_call(self.format, &body, &self.tools).is_some() {
                    self.close_call(&body, announced, out);
                } else {
                    out.push(Event::Content(format!("{START}{body}")));
                }
            }
            State::Outside | State::Plain => {
                let rest = std::mem::take(&mut self.pending);
                if !rest.is_empty() {
                    out.push(Event::Content(rest));
                }
            }
        }
    }
}

/// The function name, once the body so far has it complete (formats that name it first).
fn early_name(format: ToolFormat, body: &str) -> Option<String> {
    match format {
        ToolFormat::PoolsideV1 => {
            let name = body[..poolside_name_end(body)?].trim();
            (!name.is_empty()).then(|| name.to_string())
        }
        ToolFormat::Qwen3Coder => {
            let start = body.find("<function=")? + "<function=".len();
            let len = body[start..].find('>')?;
            let name = body[start..start + len].trim();
            (!name.is_empty()).then(|| name.to_string())
        }
        ToolFormat::Hermes | ToolFormat::Llama3Json => None,
    }
}

/// Where a `poolside_v1` call's name ends: at a newline or its first `<arg_key>`, once either
/// has arrived.
fn poolside_name_end(body: &str) -> Option<usize> {
    [body.find('\n'), body.find("<arg_key>")]
        .into_iter()
        .flatten()
        .min()
}

/// `(name, arguments JSON)` of one call's body, if it reads.
fn parse_call(format: ToolFormat, body: &str, tools: &[Value]) -> Option<(String, String)> {
    match format {
        ToolFormat::PoolsideV1 => parse_poolside(body, tools),
        ToolFormat::Qwen3Coder => parse_qwen3_coder(body, tools),
        ToolFormat::Hermes => {
            let v: Value = serde_json::from_str(body.trim()).ok()?;
            let name = v.get("name")?.as_str()?.to_string();
            let args = v
                .get("arguments")
                .cloned()
                .unwrap_or(Value::Object(Map::new()));
            Some((name, fp4forge_engine::to_python_json(&args)))
        }
        ToolFormat::Llama3Json => parse_llama_calls(body)?.into_iter().next(),
    }
}

/// The JSON type a tool's parameter schema gives `param` (`None`: no schema says).
fn param_type<'a>(tools: &'a [Value], function: &str, param: &str) -> Option<&'a str> {
    let tool = tools
        .iter()
        .find(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(function))?;
    let ty = tool
        .pointer("/function/parameters/properties")?
        .get(param)?
        .get("type")?;
    match ty {
        Value::String(s) => Some(s.as_str()),
        // A union such as ["string", "null"]: its first non-null member.
        Value::Array(list) => list.iter().filter_map(Value::as_str).find(|t| *t != "null"),
        _ => None,
    }
}

/// A value written as text, read as Python would write it: JSON, else the literals `True`,
/// `False`, `None`, else the text itself.
fn loose_value(text: &str) -> Value {
    if let Ok(v) = serde_json::from_str(text) {
        return v;
    }
    match text {
        "True" => Value::Bool(true),
        "False" => Value::Bool(false),
        "None" => Value::Null,
        _ => Value::String(text.to_string()),
    }
}

/// `NAME<arg_key>K</arg_key><arg_value>V</arg_value>…`: string parameters keep their text,
/// others are read as JSON (vLLM's `poolside_v1`).
fn parse_poolside(body: &str, tools: &[Value]) -> Option<(String, String)> {
    let name_end = poolside_name_end(body).unwrap_or(body.len());
    let name = body[..name_end].trim().to_string();
    if name.is_empty() {
        return None;
    }
    let mut args = Map::new();
    let mut rest = &body[name_end..];
    while let Some(k0) = rest.find("<arg_key>") {
        let after_key = &rest[k0 + "<arg_key>".len()..];
        let k1 = after_key.find("</arg_key>")?;
        let key = after_key[..k1].trim().to_string();
        let after = &after_key[k1 + "</arg_key>".len()..];
        let v0 = after.find("<arg_value>")?;
        if !after[..v0].trim().is_empty() {
            return None;
        }
        let value_text = &after[v0 + "<arg_value>".len()..];
        let v1 = value_text.find("</arg_value>")?;
        let raw = &value_text[..v1];
        let value = match param_type(tools, &name, &key) {
            Some("string") => Value::String(raw.to_string()),
            _ => loose_value(raw.trim()),
        };
        args.insert(key, value);
        rest = &value_text[v1 + "</arg_value>".len()..];
    }
    if !rest.trim().is_empty() {
        return None;
    }
    Some((name, fp4forge_engine::to_python_json(&Value::Object(args))))
}

/// `<function=NAME><parameter=K>\nV\n</parameter>…</function>`: values converted by the
/// parameter's schema type (vLLM's `qwen3_coder`).
fn parse_qwen3_coder(body: &str, tools: &[Value]) -> Option<(String, String)> {
    let f0 = body.find("<function=")? + "<function=".len();
    let f1 = body[f0..].find('>')? + f0;
    let name = body[f0..f1].trim().to_string();
    let end = body[f1..]
        .find("</function>")
        .map_or(body.len(), |e| e + f1);
    let mut rest = &body[f1 + 1..end];
    let mut args = Map::new();
    while let Some(p0) = rest.find("<parameter=") {
        let after = &rest[p0 + "<parameter=".len()..];
        let p1 = after.find('>')?;
        let key = after[..p1].trim().to_string();
        let value_text = &after[p1 + 1..];
        let (raw, next) = match value_text.find("</parameter>") {
            Some(v1) => (&value_text[..v1], &value_text[v1 + "</parameter>".len()..]),
            None => match value_text.find("<parameter=") {
                Some(v1) => (&value_text[..v1], &value_text[v1..]),
                None => (value_text, ""),
            },
        };
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        args.insert(
            key.clone(),
            typed_value(raw, param_type(tools, &name, &key)),
        );
        rest = next;
    }
    (!name.is_empty()).then(|| (name, fp4forge_engine::to_python_json(&Value::Object(args))))
}

/// `raw` as the schema type `ty` (vLLM's `qwen3_coder` conversion).
fn typed_value(raw: &str, ty: Option<&str>) -> Value {
    if raw.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    let ty = ty.unwrap_or("string").to_ascii_lowercase();
    match ty.as_str() {
        "integer" | "int" => raw
            .trim()
            .parse::<i64>()
            .map_or_else(|_| Value::String(raw.into()), Value::from),
        "number" | "float" => match raw.trim().parse::<f64>() {
            Ok(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            Ok(f) => Value::from(f),
            Err(_) => Value::String(raw.into()),
        },
        "boolean" | "bool" => Value::Bool(raw.trim().eq_ignore_ascii_case("true")),
        "object" | "array" | "dict" | "list" => loose_value(raw.trim()),
        _ => Value::String(raw.to_string()),
    }
}

/// Llama 3.1 JSON calls: `{"name": N, "parameters": {…}}` (or `"arguments"`), after an
/// optional `<|python_tag|>`, several separated by `;`.
fn parse_llama_calls(text: &str) -> Option<Vec<(String, String)>> {
    let text = text.trim();
    let mut rest = text.strip_prefix(PYTHON_TAG).unwrap_or(text).trim_start();
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = stream.next()?.ok()?;
        let name = v.get("name")?.as_str()?.to_string();
        let args = v
            .get("parameters")
            .or_else(|| v.get("arguments"))
            .cloned()
            .unwrap_or(Value::Object(Map::new()));
        calls.push((name, fp4forge_engine::to_python_json(&args)));
        rest = rest[stream.byte_offset()..].trim_start();
        if let Some(after) = rest.strip_prefix(';') {
            rest = after.trim_start();
        } else if !rest.is_empty() {
            return None;
        }
    }
    (!calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id() -> String {
        "call".into()
    }

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                           "hot": {"type": "boolean"}, "tags": {"type": "array"},
                           "ratio": {"type": "number"}, "code": {"type": "string"}}}}}),
        ]
    }

    /// Feeds `text` one character at a time; returns content, calls (name, arguments).
    fn run(format: ToolFormat, text: &str) -> (String, Vec<(String, String)>) {
        let mut s = ToolCallSplitter::new(format, tools(), id);
        let mut out = Vec::new();
        for c in text.chars() {
            s.push(&c.to_string(), &mut out);
        }
        s.finish(&mut out);
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        for e in out {
            match e {
                Event::Content(t) => content.push_str(&t),
                Event::ToolCall { index, name, .. } => {
                    assert_eq!(index, calls.len());
                    calls.push((name, String::new()));
                }
                Event::ToolArgs { index, fragment } => calls[index].1.push_str(&fragment),
                Event::Reasoning(_) => panic!("reasoning"),
            }
        }
        (content, calls)
    }

    #[test]
    fn poolside_calls_typed_by_schema() {
        let text = "Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Zürich</arg_value><arg_key>days</arg_key><arg_value>2</arg_value><arg_key>hot</arg_key><arg_value>false</arg_value><arg_key>tags</arg_key><arg_value>[\"a\", 1]</arg_value><arg_key>code</arg_key><arg_value>42\n</arg_value></tool_call><tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>";
        let (content, calls) = run(ToolFormat::PoolsideV1, text);
        assert_eq!(content, "Let me check.");
        assert_eq!(
            calls,
            vec![
                (
                    "get_weather".into(),
                    "{\"city\": \"Zürich\", \"days\": 2, \"hot\": false, \"tags\": [\"a\", 1], \"code\": \"42\\n\"}".into()
                ),
                ("get_weather".into(), "{\"city\": \"Paris\"}".into())
            ]
        );
    }

    #[test]
    fn hermes_and_broken_calls() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        assert_eq!(
            run(ToolFormat::Hermes, text),
            (
                String::new(),
                vec![("get_weather".into(), "{\"city\": \"Oslo\"}".into())]
            )
        );
        // Not JSON: stays content as written.
        let bad = "a <tool_call>{oops</tool_call> b";
        assert_eq!(run(ToolFormat::Hermes, bad), (bad.into(), vec![]));
        // A lone `<` that is not a tag is released.
        assert_eq!(run(ToolFormat::Hermes, "x < y"), ("x < y".into(), vec![]));
    }

    #[test]
    fn qwen3_coder_xml() {
        let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=ratio>\n2.0\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            run(ToolFormat::Qwen3Coder, text),
            (
                String::new(),
                vec![(
                    "get_weather".into(),
                    "{\"city\": \"New York\", \"ratio\": 2, \"days\": 3}".into()
                )]
            )
        );
    }

    #[test]
    fn llama3_json_whole_output() {
        let text = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}; {\"name\": \"get_weather\", \"parameters\": {}}";
        assert_eq!(
            run(ToolFormat::Llama3Json, text),
            (
                String::new(),
                vec![
                    ("get_weather".into(), "{\"city\": \"Rome\"}".into()),
                    ("get_weather".into(), "{}".into())
                ]
            )
        );
        assert_eq!(
            run(ToolFormat::Llama3Json, "Hello {x}"),
            ("Hello {x}".into(), vec![])
        );
        assert_eq!(
            run(ToolFormat::Llama3Json, "{not json"),
            ("{not json".into(), vec![])
        );
    }

    #[test]
    fn detects_formats_from_real_templates() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../engine/tests/fixtures/chat_templates/templates/"
        );
        let read = |f: &str| std::fs::read_to_string(format!("{dir}{f}")).expect(f);
        assert_eq!(
            ToolFormat::detect(&read("poolside-Laguna-S-2.1.jinja")),
            Some(ToolFormat::PoolsideV1)
        );
        assert_eq!(
            ToolFormat::detect(&read("Qwen3-Coder.jinja")),
            Some(ToolFormat::Qwen3Coder)
        );
        assert_eq!(
            ToolFormat::detect(&read("Qwen-Qwen2.5-7B-Instruct.jinja")),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::detect(&read("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")),
            Some(ToolFormat::Hermes)
        );
        assert_eq!(
            ToolFormat::detect(&read("meta-llama-Llama-3.1-8B-Instruct.jinja")),
            Some(ToolFormat::Llama3Json)
        );
    }
}
