//! CORS (`--allowed-origins`, `--allowed-methods`, `--allowed-headers`, `--allow-credentials`,
//! as vLLM names them): tower-http's [`CorsLayer`] outside every other layer, so that a
//! preflight `OPTIONS` is answered before the API key check (a browser sends no credentials
//! with it) and error responses carry the headers too.

use axum::http::{HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};

use crate::config::ServerConfig;
use crate::error::ServerError;

/// The layer `config` asks for; `None` without allowed origins (no CORS headers at all).
/// Errors name the flag whose value is unusable.
pub(crate) fn layer(config: &ServerConfig) -> Result<Option<CorsLayer>, ServerError> {
    if config.allowed_origins.is_empty() {
        return Ok(None);
    }
    let bad = |flag: &str, value: &str, why: &str| {
        ServerError::Config(format!("--{flag}: {value:?} {why}"))
    };
    let any = |list: &[String]| list.iter().any(|v| v == "*");
    // With credentials, browsers refuse `*`: the request's own origin, method and headers are
    // mirrored instead (as Starlette, vLLM's server, does).
    let credentials = config.allow_credentials;
    let origin = if any(&config.allowed_origins) {
        if credentials {
            AllowOrigin::mirror_request()
        } else {
            AllowOrigin::any()
        }
    } else {
        let list = config
            .allowed_origins
            .iter()
            .map(|o| {
                HeaderValue::from_str(o)
                    .map_err(|_| bad("allowed-origins", o, "is not a usable origin"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        AllowOrigin::list(list)
    };
    let methods = if any(&config.allowed_methods) {
        if credentials {
            AllowMethods::mirror_request()
        } else {
            AllowMethods::any()
        }
    } else {
        let list = config
            .allowed_methods
            .iter()
            .map(|m| {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| bad("allowed-methods", m, "is not an HTTP method"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        AllowMethods::list(list)
    };
    let headers = if any(&config.allowed_headers) {
        if credentials {
            AllowHeaders::mirror_request()
        } else {
            AllowHeaders::any()
        }
    } else {
        let list = config
            .allowed_headers
            .iter()
            .map(|h| {
                HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| bad("allowed-headers", h, "is not an HTTP header name"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        AllowHeaders::list(list)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(origin)
            .allow_methods(methods)
            .allow_headers(headers)
            .allow_credentials(credentials),
    ))
}

/// Reads a list flag as vLLM does (a JSON list, e.g. `["https://a.example"]`) or as a comma
/// list (`https://a.example,https://b.example`); `flag` names it in the error.
pub fn parse_list(flag: &str, value: &str) -> Result<Vec<String>, String> {
    let trimmed = value.trim();
    if trimmed.starts_with('[') {
        return serde_json::from_str::<Vec<String>>(trimmed)
            .map_err(|e| format!("--{flag}: not a JSON list of strings: {e}"));
    }
    Ok(trimmed
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_json_or_comma_separated() {
        let l = |v: &str| parse_list("allowed-origins", v);
        assert_eq!(
            l(r#"["https://a.example", "*"]"#).unwrap(),
            ["https://a.example", "*"]
        );
        assert_eq!(
            l("https://a.example, https://b.example").unwrap(),
            ["https://a.example", "https://b.example"]
        );
        assert!(l("[1, 2]").unwrap_err().contains("--allowed-origins"));
    }

    #[test]
    fn unusable_values_name_their_flag() {
        let c = ServerConfig::new("m")
            .allowed_origins(vec!["*".into()])
            .allowed_methods(vec!["GE T".into()]);
        assert!(layer(&c)
            .unwrap_err()
            .to_string()
            .contains("--allowed-methods"));
        let c = ServerConfig::new("m").allowed_origins(vec!["bad\norigin".into()]);
        assert!(layer(&c)
            .unwrap_err()
            .to_string()
            .contains("--allowed-origins"));
        // Credentials with `*` mirror the request instead of panicking.
        let c = ServerConfig::new("m")
            .allowed_origins(vec!["*".into()])
            .allow_credentials(true);
        assert!(layer(&c).unwrap().is_some());
        assert!(layer(&ServerConfig::new("m")).unwrap().is_none());
    }
}
