//! The client's one error type.

use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong talking to a server or reading evaluation data. Each variant names
/// the URL, file or field it is about.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The HTTP request could not be sent or its response not received (connection refused,
    /// timeout, broken stream).
    #[error("{url}: {}", chain(error))]
    Http {
        /// The URL requested.
        url: String,
        /// The transport error (its causes are part of this error's message).
        error: reqwest::Error,
    },
    /// The server answered with a non-success status.
    #[error("{url}: HTTP {status}: {message}")]
    Status {
        /// The URL requested.
        url: String,
        /// The HTTP status code.
        status: u16,
        /// The server's error message (OpenAI's `error.message`) or the start of its body.
        message: String,
    },
    /// The server's answer is not what the OpenAI API promises (bad JSON, a missing field).
    #[error("{url}: bad response: field `{field}`: {message}")]
    Response {
        /// The URL requested.
        url: String,
        /// The JSON field (dotted path) that is missing or malformed.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A server-sent-events stream broke the SSE or the OpenAI streaming format.
    #[error("{url}: bad event stream: {message}")]
    Stream {
        /// The URL requested.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A data file's content is not in the expected layout.
    #[error("{}: {what}: {message}", path.display())]
    Data {
        /// The file.
        path: PathBuf,
        /// Where in the file (line, record, column or field).
        what: String,
        /// What is wrong with it.
        message: String,
    },
    /// A tokenizer file could not be loaded or used.
    #[error("tokenizer {}: {message}", path.display())]
    Tokenizer {
        /// The tokenizer.json file.
        path: PathBuf,
        /// The tokenizers crate's message.
        message: String,
    },
    /// An option has a value the client cannot work with.
    #[error("option `{option}`: {message}")]
    Config {
        /// The option (CLI spelling).
        option: String,
        /// Why the value is unusable.
        message: String,
    },
}

/// An error and its causes, `: `-separated ("error sending request: tcp connect error:
/// Connection refused").
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

impl ClientError {
    /// A [`ClientError::Data`] for `path`.
    pub(crate) fn data(
        path: impl Into<PathBuf>,
        what: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::Data {
            path: path.into(),
            what: what.into(),
            message: message.into(),
        }
    }

    /// A [`ClientError::Config`] for `option`.
    pub(crate) fn config(option: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Config {
            option: option.into(),
            message: message.into(),
        }
    }

    /// A [`ClientError::Response`] for `url`.
    pub(crate) fn response(
        url: impl Into<String>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::Response {
            url: url.into(),
            field: field.into(),
            message: message.into(),
        }
    }

    /// A [`ClientError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

/// The client's result type.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;
