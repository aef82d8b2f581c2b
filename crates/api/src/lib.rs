//! fp4forge-api: the OpenAI/vLLM wire format, once, for the server that speaks it and the
//! client that talks to it.
//!
//! # The idea
//!
//! A request is a typed struct with every field the API has, read by [`parse_request`] in
//! four steps, each refusing with an error that names the field ([`RequestError::param`]):
//!
//! ```text
//! body            JSON that parses, an object                       "malformed JSON ..."
//! keys            each one a field of the type ........ unknown ->  "unknown field `foo`"
//!                 or an unimplemented field at its neutral value .. "`best_of` is not supported"
//! serde           each field of its JSON type .................... "`n` must be an integer"
//! validate()      ranges and server limits ....................... "`n` = 9 exceeds ..."
//! ```
//!
//! Three kinds of field, listed explicitly per request type:
//!
//! - **honoured**: the type's fields that change the result (`temperature`, `stop`, ...);
//! - **accepted and ignored**: fields with no effect on what is generated, also fields of the
//!   type and documented as such (`user`; for chat also `store`, `metadata`,
//!   `service_tier`, a message's `name`);
//! - **unimplemented**: OpenAI and vLLM fields fp4forge does not implement
//!   ([`WireRequest::UNIMPLEMENTED`]: beam search, `prompt_logprobs`, ...), refused unless
//!   null or at a neutral value that asks for nothing (`use_beam_search: false`). Anything
//!   else is an unknown field, refused.
//!
//! Responses ([`CompletionResponse`], [`ChatCompletionResponse`]), stream chunks
//! ([`StreamChunk`]), the model list ([`ModelList`]) and the error body ([`ErrorResponse`])
//! serialize exactly as the server sends them and read leniently (absent fields default,
//! extra fields ignored), so the client reads vLLM's answers with the same types.
#![deny(missing_docs)]

mod error;
mod integer;
mod models;
mod parse;
pub mod requests;
mod response;
mod stream;

pub use error::{ErrorBody, ErrorResponse, RequestError};
pub use integer::Integer;
pub use models::{ModelEntry, ModelList};
pub use parse::{
    describe, parse_object, parse_request, request_from_map, show, type_name, Field, Unimplemented,
    WireRequest, COMMON_FIELDS,
};
pub use requests::chat::{
    ChatCompletionRequest, ChatMessage, ContentPart, MessageContent, MessageFunction,
    MessageToolCall, Role, ToolChoice,
};
pub use requests::completion::{CompletionRequest, Prompt, SinglePrompt};
pub use requests::structured::{
    Constrained, JsonSchemaFormat, OutputConstraint, ResponseFormat, StructuredFields,
    StructuredOutputs,
};
pub use requests::tokenize::{
    parse_detokenize, parse_tokenize, DetokenizeRequest, DetokenizeResponse, TokenizeChatRequest,
    TokenizeCompletionRequest, TokenizeRequest, TokenizeResponse, VersionResponse,
};
pub use requests::{
    GenerationRequest, Limits, Sampling, Stop, StreamOptions, MAX_STOPS, MAX_STOP_BYTES,
};
pub use response::{
    AssistantMessage, ChatChoice, ChatCompletionResponse, ChatLogprobs, ChatTokenLogprob,
    ChatTopLogprob, CompletionChoice, CompletionLogprobs, CompletionResponse, FunctionCall,
    PromptLogprob, PromptLogprobs, PromptTokensDetails, ToolCall, TopLogprobs, Usage,
};
pub use stream::{
    ChatChunkChoice, ChatCompletionChunk, ChatDelta, CompletionChunk, FunctionCallDelta,
    StreamChunk, ToolCallDelta,
};
