//! Chat templates as Hugging Face writes them: Jinja2 source from `chat_template.jinja` or
//! `tokenizer_config.json`, rendered with `messages`, `add_generation_prompt`, `bos_token`,
//! `eos_token`, and the helpers templates call (`raise_exception`, `strftime_now`).

use std::path::Path;

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::EngineError;

/// One chat message (`role` is `system`, `user`, `assistant` or `tool`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: String,
    /// What is said.
    pub content: String,
}

/// A compiled chat template with the special-token strings it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    // Templates use it for "today's date" in system prompts; UTC is the honest default.
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
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
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
    let month_name = MONTHS[(month - 1) as usize];
    format
        .replace("%Y", &year.to_string())
        .replace("%m", &format!("{month:02}"))
        .replace("%d", &format!("{day:02}"))
        .replace("%B", month_name)
        .replace("%b", &month_name[..3])
}

impl ChatTemplate {
    /// Compiles `source`; `origin` names where it came from, for errors.
    pub fn new(
        source: &str,
        origin: &Path,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, EngineError> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| EngineError::ChatTemplate {
                path: origin.to_path_buf(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Renders a conversation; `add_generation_prompt` appends the assistant's turn opener.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EngineError> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| EngineError::ChatRender {
                reason: e.to_string(),
            })?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| EngineError::ChatRender {
                reason: format!("{e:#}"),
            })
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

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(CHATML, Path::new("t"), "<s>".into(), "</s>".into()).unwrap();
        let out = t
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
        let t = ChatTemplate::new(src, Path::new("t"), "<s>".into(), "</s>".into()).unwrap();
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
}
