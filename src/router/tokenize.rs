//! Tokenizing as the engine does: the model directory's `tokenizer.json` through the Hugging
//! Face `tokenizers` crate, and its chat template (`chat_template.jinja`, or
//! `tokenizer_config.json`'s `chat_template`) through minijinja, configured as transformers
//! renders it (trim and lstrip blocks, `raise_exception`, `strftime_now`, Python string
//! methods). Completions are encoded with special tokens (vLLM's default), rendered chats
//! without (the template writes them).

use serde_json::Value;
use std::path::Path;

/// Why a model directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.json` is missing or invalid.
    #[error("{path}: {message}")]
    Tokenizer {
        /// The file.
        path: String,
        /// What was wrong.
        message: String,
    },
    /// The chat template does not compile.
    #[error("chat template of {dir}: {message}")]
    Template {
        /// The model directory.
        dir: String,
        /// The template error.
        message: String,
    },
}

/// A model's tokenizer and chat template.
pub struct ModelTokenizer {
    tokenizer: tokenizers::Tokenizer,
    chat: Option<minijinja::Environment<'static>>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("vocab", &self.tokenizer.get_vocab_size(true))
            .field("chat_template", &self.chat.is_some())
            .finish()
    }
}

/// A special token in `tokenizer_config.json`: a string or `{"content": …}`.
fn special(config: &Value, name: &str) -> String {
    match config.get(name) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

/// The template text: `chat_template.jinja` first (transformers ≥ 4.43 writes it there),
/// else `chat_template` of the config (a string, or a list of named templates: `default`).
fn template_text(dir: &Path, config: &Value) -> Option<String> {
    if let Ok(text) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Some(text);
    }
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

fn environment(text: String) -> Result<minijinja::Environment<'static>, minijinja::Error> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_function("strftime_now", |_fmt: String| String::new());
    env.add_template_owned("chat", text)?;
    Ok(env)
}

impl ModelTokenizer {
    /// Loads `dir/tokenizer.json` (padding and truncation off, as vLLM encodes) and the chat
    /// template if the directory has one.
    ///
    /// # Errors
    /// [`TokenizerError`] when the tokenizer is missing or invalid, or the template does not
    /// compile.
    pub fn load(dir: &Path) -> Result<Self, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let mut tokenizer =
            tokenizers::Tokenizer::from_file(&path).map_err(|e| TokenizerError::Tokenizer {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| TokenizerError::Tokenizer {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
        let config: Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        let chat = template_text(dir, &config)
            .map(environment)
            .transpose()
            .map_err(|e| TokenizerError::Template {
                dir: dir.display().to_string(),
                message: e.to_string(),
            })?;
        Ok(Self {
            tokenizer,
            chat,
            bos_token: special(&config, "bos_token"),
            eos_token: special(&config, "eos_token"),
        })
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> u32 {
        u32::try_from(self.tokenizer.get_vocab_size(true)).unwrap_or(u32::MAX)
    }

    /// Whether a chat template was found.
    pub fn has_chat_template(&self) -> bool {
        self.chat.is_some()
    }

    /// The token ids of `text`.
    ///
    /// # Errors
    /// The tokenizer's error text.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// The chat rendered by the template, with the generation prompt (as vLLM's default
    /// `add_generation_prompt: true`, overridable in the request); `extra` are the request's
    /// `chat_template_kwargs` and its `tools`.
    ///
    /// # Errors
    /// No template, or the template's error.
    pub fn render_chat(&self, request: &serde_json::Map<String, Value>) -> Result<String, String> {
        let env = self
            .chat
            .as_ref()
            .ok_or("the model directory has no chat template")?;
        let template = env.get_template("chat").map_err(|e| e.to_string())?;
        let mut ctx = serde_json::Map::new();
        if let Some(Value::Object(kw)) = request.get("chat_template_kwargs") {
            ctx.extend(kw.clone());
        }
        ctx.insert(
            "messages".into(),
            request.get("messages").cloned().unwrap_or(Value::Null),
        );
        for key in ["tools", "documents"] {
            if let Some(v) = request.get(key).filter(|v| !v.is_null()) {
                ctx.insert(key.into(), v.clone());
            }
        }
        let add_generation_prompt = request
            .get("add_generation_prompt")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        ctx.entry("add_generation_prompt")
            .or_insert(Value::Bool(add_generation_prompt));
        ctx.entry("bos_token")
            .or_insert_with(|| Value::String(self.bos_token.clone()));
        ctx.entry("eos_token")
            .or_insert_with(|| Value::String(self.eos_token.clone()));
        template
            .render(minijinja::Value::from_serialize(&ctx))
            .map_err(|e| e.to_string())
    }

    /// The token ids of a chat request (rendered, then encoded without special tokens unless
    /// the request says `add_special_tokens`).
    ///
    /// # Errors
    /// As [`ModelTokenizer::render_chat`] and [`ModelTokenizer::encode`].
    pub fn encode_chat(
        &self,
        request: &serde_json::Map<String, Value>,
    ) -> Result<Vec<u32>, String> {
        let text = self.render_chat(request)?;
        let special = request
            .get("add_special_tokens")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        self.encode(&text, special)
    }
}
