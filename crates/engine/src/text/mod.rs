//! Text in and out: the checkpoint's tokenizer (`tokenizer.json`, via the `tokenizers` crate) and
//! its chat template (Jinja, rendered by `minijinja` with Python-compatible string methods).

mod chat_template;
mod tokenizer;

pub use chat_template::{to_python_json, ChatInput, ChatMessage, ChatTemplate};
pub use tokenizer::{StreamDecoder, TextCodec};
