//! Chat templates rendered as transformers renders them (`apply_chat_template(tokenize=False)`,
//! i.e. `render_jinja_template` of transformers 5.17): Jinja2 source from `chat_template.jinja`
//! or `tokenizer_config.json` (a string, or a list of named templates), with
//!
//! - the variables transformers passes: `messages` (any JSON: `tool_calls`, `tool_call_id`,
//!   `reasoning_content`, ... reach the template as given), `tools`, `documents`,
//!   `add_generation_prompt`, `bos_token`, `eos_token`, and every extra keyword
//!   (`chat_template_kwargs` such as `enable_thinking`);
//! - its environment: `trim_blocks`, `lstrip_blocks`, `{% break %}` / `{% continue %}`, the
//!   `{% generation %}` block (transformers' assistant-mask extension: its body renders as is),
//!   `is iterable` false for `none` as in Jinja2, `tojson` as Python's `json.dumps` (`ensure_ascii`, `indent`, `separators`, `sort_keys`; no
//!   HTML escaping), `raise_exception`, `strftime_now`, and Python's string and dict methods;
//! - `continue_final_message`: the final message is left open (the text after its content is
//!   cut), found as transformers finds it.

use std::path::Path;

use minijinja::value::Kwargs;
use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::EngineError;

/// One plain chat message (`role` is `system`, `user`, `assistant` or `tool`); richer messages
/// (tool calls, reasoning) go to [`ChatInput::messages`] as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: String,
    /// What is said.
    pub content: String,
}

/// Everything a chat template is rendered with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatInput {
    /// The conversation, each message a JSON object as the template sees it.
    pub messages: Vec<Json>,
    /// Tool definitions (OpenAI's `{"type": "function", "function": {...}}`), or `None`.
    pub tools: Option<Vec<Json>>,
    /// Documents for retrieval-augmented templates, or `None`.
    pub documents: Option<Vec<Json>>,
    /// Append the assistant's turn opener.
    pub add_generation_prompt: bool,
    /// Leave the final message open for the model to continue (nothing after its content).
    pub continue_final_message: bool,
    /// Extra template variables (`chat_template_kwargs`: `enable_thinking`, ...).
    pub kwargs: Map<String, Json>,
}

impl ChatInput {
    /// A conversation of plain messages, with the generation prompt.
    pub fn plain(messages: &[ChatMessage]) -> Self {
        Self {
            messages: messages
                .iter()
                .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
                .collect(),
            add_generation_prompt: true,
            ..Self::default()
        }
    }
}

/// The marker transformers appends to the final message for `continue_final_message`.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// A compiled chat template (or a set of named ones) with the special-token strings it may
/// refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Template names in the environment: `default` and, for a named set, the others.
    names: Vec<String>,
    /// The sources, to check `continue_final_message` as transformers does.
    sources: Vec<String>,
    bos_token: String,
    eos_token: String,
}

fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

/// Today's date (UTC) as `(year, month, day)`; `FP4FORGE_CHAT_DATE=YYYY-MM-DD` pins it (for
/// reproducible renders).
fn today() -> (i64, u32, u32) {
    if let Ok(pinned) = std::env::var("FP4FORGE_CHAT_DATE") {
        let parts: Vec<_> = pinned.split('-').collect();
        if let [y, m, d] = parts.as_slice() {
            if let (Ok(y), Ok(m), Ok(d)) = (y.parse(), m.parse(), d.parse()) {
                return (y, m, d);
            }
        }
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Python's `datetime.now().strftime(format)` for the date directives templates use (`%Y %y %m
/// %d %e %B %b %A %a %j %%`); time-of-day directives are refused by name (the server has no
/// meaningful local time to put in a prompt).
fn strftime_now(format: String) -> Result<String, JinjaError> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let (year, month, day) = today();
    let month_name = MONTHS[(month as usize).clamp(1, 12) - 1];
    // Day of the week and of the year from the civil date.
    let days_before: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let yday = days_before[(month as usize).clamp(1, 12) - 1] + day + u32::from(leap && month > 2);
    let y = if month <= 2 { year - 1 } else { year };
    let t = [0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4][(month as usize).clamp(1, 12) - 1];
    let sunday0 = (y + y / 4 - y / 100 + y / 400 + t + i64::from(day)).rem_euclid(7) as usize;
    let weekday = DAYS[(sunday0 + 6) % 7];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                return Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: %{other} is not supported (date directives only)"),
                ))
            }
            None => out.push('%'),
        }
    }
    Ok(out)
}

/// Python's `json.dumps` formatting: separators, indent and `ensure_ascii`.
struct PyJson {
    item_sep: Vec<u8>,
    key_sep: Vec<u8>,
    indent: Option<Vec<u8>>,
    ensure_ascii: bool,
    depth: usize,
    has_value: bool,
}

impl PyJson {
    fn newline(&self, w: &mut (impl std::io::Write + ?Sized)) -> std::io::Result<()> {
        if let Some(indent) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.depth {
                w.write_all(indent)?;
            }
        }
        Ok(())
    }

    fn begin(
        &mut self,
        w: &mut (impl std::io::Write + ?Sized),
        open: &[u8],
    ) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(open)
    }

    fn end(&mut self, w: &mut (impl std::io::Write + ?Sized), close: &[u8]) -> std::io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        self.has_value = true;
        w.write_all(close)
    }

    fn item(&mut self, w: &mut (impl std::io::Write + ?Sized), first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(&self.item_sep)?;
        }
        self.newline(w)
    }
}

impl serde_json::ser::Formatter for PyJson {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.begin(w, b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.end(w, b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.begin(w, b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.end(w, b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(&self.key_sep)
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn write_f64<W: ?Sized + std::io::Write>(&mut self, w: &mut W, v: f64) -> std::io::Result<()> {
        w.write_all(python_float(v).as_bytes())
    }
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if !self.ensure_ascii || fragment.is_ascii() {
            return w.write_all(fragment.as_bytes());
        }
        for c in fragment.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
    }
}

/// Python's `repr(float)`: shortest round trip, `1.0` for whole numbers, exponent form
/// (`1e-05`, `1e+16`) outside `1e-4 <= |v| < 1e16`, `NaN` / `Infinity` as `json.dumps` writes them.
fn python_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let abs = v.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        let s = format!("{v:e}"); // e.g. "1e-5", "1.5e16"
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let s = format!("{v}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// Sorts every object's keys (Python's `sort_keys=True`).
fn sort_keys(v: Json) -> Json {
    match v {
        Json::Object(m) => {
            let mut entries: Vec<_> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Json::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        Json::Array(a) => Json::Array(a.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

/// The `tojson` filter as transformers defines it: `json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`, no HTML escaping.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.as_bytes().to_vec(),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    JinjaError::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: indent must be an integer or a string, not {v}"),
                    )
                })?;
                vec![b' '; n.max(0) as usize]
            }
        }),
    };
    let (item_sep, key_sep) = match separators.filter(|s| !s.is_none()) {
        Some(seps) => {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => (
                    a.as_str().unwrap_or_default().as_bytes().to_vec(),
                    b.as_str().unwrap_or_default().as_bytes().to_vec(),
                ),
                _ => {
                    return Err(JinjaError::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
        // Python: (', ', ': ') without indent, (',', ': ') with it.
        None if indent.is_some() => (b",".to_vec(), b": ".to_vec()),
        None => (b", ".to_vec(), b": ".to_vec()),
    };
    let mut json = serde_json::to_value(&value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    if sort.unwrap_or(false) {
        json = sort_keys(json);
    }
    let formatter = PyJson {
        item_sep,
        key_sep,
        indent,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        depth: 0,
        has_value: false,
    };
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    json.serialize(&mut ser)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(text))
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it (`", "` and `": "`
/// separators): how vLLM writes a tool call's arguments.
pub fn to_python_json(value: &Json) -> String {
    let formatter = PyJson {
        item_sep: b", ".to_vec(),
        key_sep: b": ".to_vec(),
        indent: None,
        ensure_ascii: false,
        depth: 0,
        has_value: false,
    };
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    // Writing a JSON value into memory cannot fail.
    let _ = value.serialize(&mut ser);
    String::from_utf8(out).unwrap_or_default()
}

/// Rewrites transformers' `{% generation %}` / `{% endgeneration %}` tags (an extension whose
/// body renders unchanged) into an always-true `if` with the same whitespace control, which
/// minijinja parses.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open_ws, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, close_ws) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[body.len() - 1..]),
            None => (body, ""),
        };
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{open_ws} if true {close_ws}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{open_ws} endif {close_ws}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

impl ChatTemplate {
    /// Compiles `source`; `origin` names where it came from, for errors.
    pub fn new(
        source: &str,
        origin: &Path,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, EngineError> {
        Self::named(
            vec![("default".to_string(), source.to_string())],
            origin,
            bos_token,
            eos_token,
        )
    }

    /// Compiles a set of named templates (`tokenizer_config.json`'s list form, e.g. `default`
    /// and `tool_use`): `tool_use` renders requests with tools where it exists, `default` the
    /// rest (as transformers chooses).
    pub fn named(
        templates: Vec<(String, String)>,
        origin: &Path,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, EngineError> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        // Jinja2: `none is iterable` is false (minijinja iterates none as empty).
        env.add_test("iterable", |v: Value| !v.is_none() && v.try_iter().is_ok());
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        let mut names = Vec::new();
        let mut sources = Vec::new();
        for (name, source) in templates {
            env.add_template_owned(name.clone(), rewrite_generation_tags(&source))
                .map_err(|e| EngineError::ChatTemplate {
                    path: origin.to_path_buf(),
                    reason: format!("template {name:?}: {e}"),
                })?;
            names.push(name);
            sources.push(source);
        }
        if !names.iter().any(|n| n == "default") {
            return Err(EngineError::ChatTemplate {
                path: origin.to_path_buf(),
                reason: format!("no template named \"default\" among {names:?}"),
            });
        }
        Ok(Self {
            env,
            names,
            sources,
            bos_token,
            eos_token,
        })
    }

    /// The source of the template used for requests without tools (`default`).
    pub fn source(&self) -> &str {
        self.names
            .iter()
            .position(|n| n == "default")
            .map_or("", |i| self.sources[i].as_str())
    }

    /// Renders a conversation of plain messages; `add_generation_prompt` appends the
    /// assistant's turn opener.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        self.render_input(&ChatInput {
            add_generation_prompt,
            ..ChatInput::plain(messages)
        })
    }

    /// Renders `input` as transformers' `apply_chat_template(..., tokenize=False)` would.
    pub fn render_input(&self, input: &ChatInput) -> Result<String, EngineError> {
        let err = |reason: String| EngineError::ChatRender { reason };
        let name = if input.tools.is_some() && self.names.iter().any(|n| n == "tool_use") {
            "tool_use"
        } else {
            "default"
        };
        let source = self
            .names
            .iter()
            .position(|n| n == name)
            .map_or("", |i| self.sources[i].as_str());
        let template = self
            .env
            .get_template(name)
            .map_err(|e| err(e.to_string()))?;
        let mut messages = input.messages.clone();
        let mut final_text = None;
        if input.continue_final_message {
            let last = messages
                .last_mut()
                .and_then(Json::as_object_mut)
                .ok_or_else(|| err("continue_final_message: there is no final message".into()))?;
            if !source.contains("content") {
                return Err(err(
                    "continue_final_message is set but the template does not use \
                     a message's \"content\""
                        .into(),
                ));
            }
            final_text = Some(continue_tag(last)?);
        }
        let mut ctx: Map<String, Json> = input.kwargs.clone();
        ctx.insert("messages".into(), Json::Array(messages));
        ctx.insert(
            "tools".into(),
            input.tools.clone().map_or(Json::Null, Json::Array),
        );
        ctx.insert(
            "documents".into(),
            input.documents.clone().map_or(Json::Null, Json::Array),
        );
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(input.add_generation_prompt),
        );
        ctx.entry("bos_token")
            .or_insert_with(|| Json::String(self.bos_token.clone()));
        ctx.entry("eos_token")
            .or_insert_with(|| Json::String(self.eos_token.clone()));
        let rendered = template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| err(format!("{e:#}")))?;
        match final_text {
            None => Ok(rendered),
            Some(final_text) => cut_at_continue_tag(rendered, &final_text).map_err(err),
        }
    }
}

/// Appends [`CONTINUE_TAG`] to the final message's text (its `content` string, or the last
/// text part of a list); returns the text it had.
fn continue_tag(last: &mut Map<String, Json>) -> Result<String, EngineError> {
    let err = |reason: &str| EngineError::ChatRender {
        reason: format!("continue_final_message: {reason}"),
    };
    match last.get_mut("content") {
        Some(Json::String(s)) => {
            let text = s.clone();
            s.push_str(CONTINUE_TAG);
            Ok(text)
        }
        Some(Json::Array(parts)) => {
            for part in parts.iter_mut().rev() {
                if let Some(Json::String(t)) = part.get_mut("text") {
                    let text = t.clone();
                    t.push_str(CONTINUE_TAG);
                    return Ok(text);
                }
            }
            Err(err("the final message has no text to continue"))
        }
        _ => Err(err("the final message has no \"content\" to continue")),
    }
}

/// Cuts `rendered` where the tag after the final message's text stands (as transformers does,
/// trimming trailing space the template may have moved).
fn cut_at_continue_tag(rendered: String, final_text: &str) -> Result<String, String> {
    let tag = CONTINUE_TAG.trim();
    if !rendered.contains(final_text.trim()) || !rendered.contains(tag) {
        return Err(
            "continue_final_message: the final message does not appear in the \
                    rendered chat (the template changes it)"
                .into(),
        );
    }
    let at = rendered.rfind(tag).unwrap_or(rendered.len());
    if rendered[at..].starts_with(CONTINUE_TAG) {
        Ok(rendered[..at].to_string())
    } else {
        Ok(rendered[..at].trim_end().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    fn template(src: &str) -> ChatTemplate {
        ChatTemplate::new(src, Path::new("t"), "<s>".into(), "</s>".into()).unwrap()
    }

    #[test]
    fn renders_chatml() {
        let out = template(CHATML)
            .render(&[msg("system", "Be brief."), msg("user", " Hi ")], true)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_string_methods_and_raise_exception() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}{{ messages[0].content.strip().upper() }}{{ bos_token }}";
        let t = template(src);
        assert_eq!(t.render(&[msg("user", " hey ")], false).unwrap(), "HEY<s>");
        let err = t.render(&[msg("assistant", "x")], false).unwrap_err();
        assert!(err.to_string().contains("first must be user"), "{err}");
    }

    #[test]
    fn a_broken_template_names_its_file() {
        let err = ChatTemplate::new(
            "{% for %}",
            Path::new("dir/chat_template.jinja"),
            String::new(),
            String::new(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("chat_template.jinja"), "{err}");
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let t = template(
            "{{ messages[0] | tojson }}|{{ messages[0] | tojson(ensure_ascii=True) }}|{{ messages[0] | tojson(indent=2) }}|{{ messages[0] | tojson(separators=(',', ':'), sort_keys=true) }}",
        );
        let input = ChatInput {
            messages: vec![
                serde_json::json!({"z": "Zürich <&>", "a": [1, 2.5, 3.0, 1e-5], "e": {}}),
            ],
            ..ChatInput::default()
        };
        assert_eq!(
            t.render_input(&input).unwrap(),
            "{\"z\": \"Zürich <&>\", \"a\": [1, 2.5, 3.0, 1e-05], \"e\": {}}|\
             {\"z\": \"Z\\u00fcrich <&>\", \"a\": [1, 2.5, 3.0, 1e-05], \"e\": {}}|\
             {\n  \"z\": \"Zürich <&>\",\n  \"a\": [\n    1,\n    2.5,\n    3.0,\n    1e-05\n  ],\n  \"e\": {}\n}|\
             {\"a\":[1,2.5,3.0,1e-05],\"e\":{},\"z\":\"Zürich <&>\"}"
        );
        let bad = template("{{ messages | tojson(ascii=True) }}");
        assert!(bad.render_input(&input).is_err());
    }

    #[test]
    fn generation_blocks_render_their_body() {
        let t = template("{%- for m in messages -%}{%- generation -%} [{{ m.content }}] {%- endgeneration -%}{%- endfor -%}");
        assert_eq!(
            t.render(&[msg("user", "a"), msg("assistant", "b")], false)
                .unwrap(),
            "[a][b]"
        );
    }

    #[test]
    fn strftime_knows_dates_and_refuses_times() {
        std::env::set_var("FP4FORGE_CHAT_DATE", "2026-01-15");
        assert_eq!(
            strftime_now("%A %d %b %Y (%j) %y-%m-%e %B %a %%".into()).unwrap(),
            "Thursday 15 Jan 2026 (015) 26-01-15 January Thu %"
        );
        assert!(strftime_now("%H:%M".into()).is_err());
    }

    #[test]
    fn python_floats() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.1), "0.1");
        assert_eq!(python_float(1e-5), "1e-05");
        assert_eq!(python_float(1.5e16), "1.5e+16");
        assert_eq!(python_float(123456.75), "123456.75");
    }
}
