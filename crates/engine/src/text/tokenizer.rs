//! The checkpoint's tokenizer and special tokens, and streaming detokenization.

use std::fs;
use std::path::Path;

use serde_json::Value;
use tokenizers::Tokenizer;

use super::chat_template::{ChatMessage, ChatTemplate};
use crate::EngineError;

/// Tokenizer, chat template and stop tokens of one checkpoint directory.
pub struct TextCodec {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    /// BOS and EOS as text (`tokenizer_config.json`), for templates compiled later.
    bos_text: String,
    eos_text: String,
    bos_id: Option<u32>,
    add_bos: bool,
    stop_ids: Vec<u32>,
}

fn read_json(path: &Path) -> Result<Option<Value>, EngineError> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| EngineError::TextFile {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(EngineError::TextFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

/// A token given in `tokenizer_config.json` as a string or as `{"content": ...}`.
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// Token ids from a JSON number or list of numbers.
fn id_list(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|n| n as u32))
            .collect(),
        _ => Vec::new(),
    }
}

impl TextCodec {
    /// Loads `tokenizer.json`, the chat template (`chat_template.jinja`, else
    /// `tokenizer_config.json`'s `chat_template`), and the stop tokens (`generation_config.json`
    /// `eos_token_id`, else `config.json`'s, else the tokenizer's eos token) from `dir`.
    pub fn load(dir: &Path) -> Result<Self, EngineError> {
        let tokenizer_path = dir.join("tokenizer.json");
        if !tokenizer_path.exists() {
            return Err(EngineError::TextFile {
                path: tokenizer_path,
                reason: "missing (every checkpoint needs its tokenizer.json)".into(),
            });
        }
        let tokenizer =
            Tokenizer::from_file(&tokenizer_path).map_err(|e| EngineError::TextFile {
                path: tokenizer_path.clone(),
                reason: e.to_string(),
            })?;
        let tok_config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let gen_config = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
        let model_config = read_json(&dir.join("config.json"))?.unwrap_or(Value::Null);

        let bos = token_string(tok_config.get("bos_token"));
        let eos = token_string(tok_config.get("eos_token"));
        let bos_id = bos
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t))
            .or_else(|| id_list(gen_config.get("bos_token_id")).first().copied());
        let add_bos = tok_config
            .get("add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut stop_ids = id_list(gen_config.get("eos_token_id"));
        if stop_ids.is_empty() {
            stop_ids = id_list(model_config.get("eos_token_id"));
        }
        if stop_ids.is_empty() {
            stop_ids.extend(eos.as_deref().and_then(|t| tokenizer.token_to_id(t)));
        }

        let jinja_path = dir.join("chat_template.jinja");
        let (bos_text, eos_text) = (
            bos.clone().unwrap_or_default(),
            eos.clone().unwrap_or_default(),
        );
        let template = if jinja_path.exists() {
            let text = fs::read_to_string(&jinja_path).map_err(|e| EngineError::TextFile {
                path: jinja_path.clone(),
                reason: e.to_string(),
            })?;
            Some(ChatTemplate::new(&text, &jinja_path, bos_text, eos_text)?)
        } else {
            let origin = dir.join("tokenizer_config.json");
            match tok_config.get("chat_template") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(ChatTemplate::new(s, &origin, bos_text, eos_text)?),
                Some(Value::Array(list)) => {
                    let named = list
                        .iter()
                        .map(|t| match (t.get("name"), t.get("template")) {
                            (Some(Value::String(n)), Some(Value::String(src))) => {
                                Ok((n.clone(), src.clone()))
                            }
                            _ => Err(EngineError::ChatTemplate {
                                path: origin.clone(),
                                reason: "`chat_template` list entries need string `name` and \
                                         `template`"
                                    .into(),
                            }),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    Some(ChatTemplate::named(named, &origin, bos_text, eos_text)?)
                }
                Some(other) => {
                    return Err(EngineError::ChatTemplate {
                        path: origin,
                        reason: format!(
                            "`chat_template` must be a string or a list of named templates, \
                             not {other}"
                        ),
                    })
                }
            }
        };
        Ok(Self {
            tokenizer,
            template,
            bos_text: bos.unwrap_or_default(),
            eos_text: eos.unwrap_or_default(),
            bos_id,
            add_bos,
            stop_ids,
        })
    }

    /// Token ids of `text`; with `add_bos`, the BOS token is prepended when the tokenizer config
    /// asks for it (`add_bos_token`) and the text does not already start with it.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, EngineError> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| EngineError::Tokenizer {
                reason: e.to_string(),
            })?;
        let mut ids = encoding.get_ids().to_vec();
        if add_bos && self.add_bos {
            if let Some(bos) = self.bos_id {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        Ok(ids)
    }

    /// The text of `ids` (special tokens included when `keep_special`).
    pub fn decode(&self, ids: &[u32], keep_special: bool) -> Result<String, EngineError> {
        self.tokenizer
            .decode(ids, !keep_special)
            .map_err(|e| EngineError::Tokenizer {
                reason: e.to_string(),
            })
    }

    /// Renders a chat with the checkpoint's template (error if it has none).
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        self.chat_template()?
            .render(messages, add_generation_prompt)
    }

    /// The checkpoint's chat template (error if it has none).
    pub fn chat_template(&self) -> Result<&ChatTemplate, EngineError> {
        self.template.as_ref().ok_or(EngineError::NoChatTemplate)
    }

    /// Compiles another template (a request's or `--chat-template`'s) with this checkpoint's
    /// BOS and EOS strings; `origin` names it in errors.
    pub fn compile_template(
        &self,
        source: &str,
        origin: &Path,
    ) -> Result<ChatTemplate, EngineError> {
        ChatTemplate::new(source, origin, self.bos_text.clone(), self.eos_text.clone())
    }

    /// Whether the checkpoint has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Token ids that end generation.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The string of a token id, if it exists.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// A streaming decoder for one generation.
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            codec: self,
            ids: Vec::new(),
            emitted: 0,
        }
    }
}

/// Turns generated ids into text pieces as they arrive, never splitting a UTF-8 character or a
/// byte-level token sequence: a piece is emitted once the decoded text grows by whole characters.
pub struct StreamDecoder<'a> {
    codec: &'a TextCodec,
    ids: Vec<u32>,
    emitted: usize,
}

impl StreamDecoder<'_> {
    /// Adds one id; returns the new text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, EngineError> {
        self.ids.push(id);
        let text = self.codec.decode(&self.ids, false)?;
        // An incomplete UTF-8 sequence decodes to U+FFFD at the end: wait for more ids.
        if text.ends_with('\u{FFFD}') || text.len() < self.emitted {
            return Ok(String::new());
        }
        let piece = text.get(self.emitted..).unwrap_or_default().to_string();
        self.emitted = text.len();
        Ok(piece)
    }

    /// All text decoded so far.
    pub fn text(&self) -> Result<String, EngineError> {
        self.codec.decode(&self.ids, false)
    }
}
