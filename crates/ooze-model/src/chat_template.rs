//! Chat templates rendered the way `transformers.apply_chat_template` renders them, byte for byte.
//!
//! transformers runs Jinja2 with `trim_blocks`, `lstrip_blocks`, loop controls, a `tojson` filter that
//! is Python's `json.dumps(ensure_ascii=False)` (", " and ": " separators, `indent=` supported),
//! `raise_exception(message)` and `strftime_now(format)`, with the tokenizer's special tokens
//! (`bos_token`, `eos_token`, …) and any extra keyword arguments (`enable_thinking`, `date_string`)
//! in the context. Here the same environment is built on minijinja: Python string/dict methods come
//! from minijinja-contrib's pycompat, and values print as Python prints them (`None`, `True`).
//!
//! Beyond rendering: [`ChatTemplate::assistant_spans`] finds the byte range each assistant message
//! occupies (for SFT loss masks), and [`ChatTemplate::continuation`] renders only what new messages
//! add to a conversation whose last assistant turn ended at its stop token (for multi-turn agents).

use crate::error::{ModelError, Result};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use std::collections::BTreeMap;
use std::fmt::Write as _;

const RAISED: &str = "\u{1}raise_exception:";
const TEMPLATE_NAME: &str = "chat";

/// What to render besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Append the header that opens an assistant turn.
    pub add_generation_prompt: bool,
    /// Tool (function) schemas, as in the OpenAI `tools` field.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Extra template variables (`enable_thinking`, `date_string`, …).
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// The byte range of one assistant message in a rendered conversation: from the end of the
/// generation prompt to the end of the turn's closing token (trailing whitespace excluded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct AssistantSpan {
    pub message: usize,
    pub start: usize,
    pub end: usize,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    origin: String,
    special_tokens: BTreeMap<String, String>,
}

impl ChatTemplate {
    /// Compiles `source`; `origin` names where it came from in error messages.
    pub fn new(
        source: &str,
        origin: &str,
        special_tokens: BTreeMap<String, String>,
    ) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("invariant: default delimiters are valid");
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            if value.kind() == ValueKind::String {
                out.write_str(value.as_str().unwrap_or_default())
                    .map_err(Error::from)
            } else if value.is_undefined() {
                Ok(())
            } else {
                out.write_str(&python_str(value)).map_err(Error::from)
            }
        });
        env.add_filter("tojson", tojson);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<Value, Error> {
                Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{RAISED}{message}"),
                ))
            },
        );
        env.add_function("strftime_now", |format: String| {
            chrono::Local::now().format(&format).to_string()
        });
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| template_error(origin, e))?;
        Ok(ChatTemplate {
            env,
            origin: origin.to_owned(),
            special_tokens,
        })
    }

    /// Renders a conversation. `messages` are chat messages as JSON objects (`role`, `content`,
    /// `tool_calls`, `reasoning_content`, …), passed through unchanged.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        options: &RenderOptions,
    ) -> Result<String> {
        let mut ctx = serde_json::Map::new();
        for (k, v) in &self.special_tokens {
            ctx.insert(k.clone(), v.clone().into());
        }
        for (k, v) in &options.kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert("messages".into(), messages.to_vec().into());
        ctx.insert(
            "tools".into(),
            options
                .tools
                .clone()
                .map_or(serde_json::Value::Null, Into::into),
        );
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            options.add_generation_prompt.into(),
        );
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .expect("invariant: added in new()");
        template
            .render(Value::from(minijinja::value::Serde(&ctx)))
            .map_err(|e| template_error(&self.origin, e))
    }

    /// Byte spans of the assistant messages in `render(messages, options)` (the generation prompt
    /// option is ignored: the full conversation is rendered without it).
    ///
    /// Each assistant message `k` is located by rendering the conversation up to it: the text after
    /// `messages[..k]` plus the generation prompt is the message's own rendering. Templates that
    /// render a message differently once later turns exist (Qwen3 drops old reasoning) are handled by
    /// matching the longest line-suffix of that rendering.
    pub fn assistant_spans(
        &self,
        messages: &[serde_json::Value],
        options: &RenderOptions,
    ) -> Result<Vec<AssistantSpan>> {
        let plain = RenderOptions {
            add_generation_prompt: false,
            ..options.clone()
        };
        let prompt = RenderOptions {
            add_generation_prompt: true,
            ..options.clone()
        };
        let full = self.render(messages, &plain)?;
        let mut spans = Vec::new();
        let mut cursor = 0;
        for (k, message) in messages.iter().enumerate() {
            if message.get("role").and_then(|r| r.as_str()) != Some("assistant") {
                continue;
            }
            let before = self.render(&messages[..k], &prompt)?;
            let through = self.render(&messages[..=k], &plain)?;
            let not_found = || ModelError::Template {
                source_name: self.origin.clone(),
                message: format!(
                    "cannot locate assistant message {k} in the rendered conversation"
                ),
            };
            let start = if full.starts_with(&before) && before.len() >= cursor {
                before.len()
            } else {
                let header = before
                    .strip_prefix(self.render(&messages[..k], &plain)?.as_str())
                    .unwrap_or("");
                line_prefixes(header)
                    .find_map(|h| full[cursor..].find(h).map(|at| cursor + at + h.len()))
                    .ok_or_else(not_found)?
            };
            let own = through
                .strip_prefix(before.as_str())
                .unwrap_or(through.as_str());
            let own_end = own.trim_end();
            let end = if full[start..].starts_with(own_end) {
                start + own_end.len()
            } else {
                line_suffixes(own_end)
                    .find_map(|s| full[start..].find(s).map(|at| start + at + s.len()))
                    .ok_or_else(not_found)?
            };
            spans.push(AssistantSpan {
                message: k,
                start,
                end,
            });
            cursor = end;
        }
        Ok(spans)
    }

    /// The text that `added` messages append to `previous`: the full render of `previous ++ added`
    /// (with `options`' generation prompt) minus the render of `previous` — cut, when `previous`
    /// ends with an assistant message, right after that message's closing token, because that is
    /// where the engine's generated tokens stop. Fails if the template renders `previous`
    /// differently once `added` follows (then the conversation cannot be extended token-exactly).
    pub fn continuation(
        &self,
        previous: &[serde_json::Value],
        added: &[serde_json::Value],
        options: &RenderOptions,
    ) -> Result<String> {
        let plain = RenderOptions {
            add_generation_prompt: false,
            ..options.clone()
        };
        let mut all = previous.to_vec();
        all.extend_from_slice(added);
        let whole = self.render(&all, options)?;
        let old = self.render(previous, &plain)?;
        let cut = match previous
            .last()
            .and_then(|m| m.get("role"))
            .and_then(|r| r.as_str())
        {
            Some("assistant") => self
                .assistant_spans(previous, &plain)?
                .last()
                .map_or(old.len(), |s| s.end),
            _ => old.len(),
        };
        if !whole.starts_with(&old[..cut]) {
            return Err(ModelError::Template {
                source_name: self.origin.clone(),
                message: format!("the template renders the first {} messages differently once {} more follow, so the conversation cannot be extended token-exactly", previous.len(), added.len()),
            });
        }
        Ok(whole[cut..].to_owned())
    }
}

fn line_prefixes(text: &str) -> impl Iterator<Item = &str> {
    let mut ends: Vec<usize> = text.match_indices('\n').map(|(i, _)| i + 1).collect();
    ends.retain(|&e| e < text.len());
    ends.push(text.len());
    ends.sort_unstable_by(|a, b| b.cmp(a));
    ends.into_iter()
        .map(move |e| &text[..e])
        .filter(|s| !s.trim().is_empty())
}

fn line_suffixes(text: &str) -> impl Iterator<Item = &str> {
    std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .map(move |s| &text[s..])
        .filter(|s| !s.trim().is_empty())
}

fn template_error(origin: &str, err: Error) -> ModelError {
    let detail = err.detail().unwrap_or_default();
    if let Some(message) = detail.strip_prefix(RAISED) {
        return ModelError::TemplateRaised {
            source_name: origin.to_owned(),
            message: message.to_owned(),
        };
    }
    let mut message = err.to_string();
    if let Some(line) = err.line() {
        let _ = write!(message, " (template line {line})");
    }
    ModelError::Template {
        source_name: origin.to_owned(),
        message,
    }
}

/// Jinja's `tojson` as transformers defines it: `json.dumps(value, ensure_ascii=False, indent=…,
/// separators=…, sort_keys=…)`.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<String, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => Some(" ".repeat(v.as_i64().unwrap_or(0).max(0) as usize)),
    };
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, &value, &style, 0)?;
    Ok(out)
}

struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    level: usize,
) -> std::result::Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&python_number(value, true)),
        ValueKind::String => write_json_string(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, style, level, '[', ']', &items, |out, item, level| {
                write_json(out, item, style, level)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            write_container(out, style, level, '{', '}', &keys, |out, key, level| {
                match key.as_str() {
                    Some(s) => write_json_string(out, s),
                    None => write_json_string(out, &python_str(key)),
                }
                out.push_str(&style.key_sep);
                write_json(out, &value.get_item(key)?, style, level)
            })?;
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialise a {other} value"),
            ))
        }
    }
    Ok(())
}

fn write_container<F>(
    out: &mut String,
    style: &JsonStyle,
    level: usize,
    open: char,
    close: char,
    items: &[Value],
    mut each: F,
) -> std::result::Result<(), Error>
where
    F: FnMut(&mut String, &Value, usize) -> std::result::Result<(), Error>,
{
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        if let Some(indent) = &style.indent {
            out.push('\n');
            out.push_str(&indent.repeat(level + 1));
        }
        each(out, item, level + 1)?;
    }
    if let Some(indent) = &style.indent {
        out.push('\n');
        out.push_str(&indent.repeat(level));
    }
    out.push(close);
    Ok(())
}

fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A number as Python prints it (`json` spells non-finite floats differently from `str`).
fn python_number(value: &Value, json: bool) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if f < 0.0 { format!("-{s}") } else { s.into() };
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci
        .split_once('e')
        .expect("invariant: {:e} has an exponent");
    let exp: i32 = exp.parse().expect("invariant: integer exponent");
    if (-4..16).contains(&exp) {
        let fixed = format!("{f}");
        if fixed.contains('.') {
            fixed
        } else {
            format!("{fixed}.0")
        }
    } else {
        format!(
            "{mantissa}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

/// `str(value)` in Python for the values JSON can hold.
fn python_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::String => value.as_str().unwrap_or_default().to_owned(),
        _ => python_repr(value),
    }
}

fn python_repr(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => "None".into(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => python_number(value, false),
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            let quote = if s.contains('\'') && !s.contains('"') {
                '"'
            } else {
                '\''
            };
            let mut out = String::from(quote);
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if c == quote => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                        let _ = write!(out, "\\x{:02x}", c as u32);
                    }
                    c => out.push(c),
                }
            }
            out.push(quote);
            out
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<String> = value
                .try_iter()
                .map(|it| it.map(|v| python_repr(&v)).collect())
                .unwrap_or_default();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = value
                .try_iter()
                .map(|it| {
                    it.map(|k| {
                        format!(
                            "{}: {}",
                            python_repr(&k),
                            python_repr(&value.get_item(&k).unwrap_or_default())
                        )
                    })
                    .collect()
                })
                .unwrap_or_default();
            format!("{{{}}}", items.join(", "))
        }
        _ => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(source: &str) -> ChatTemplate {
        ChatTemplate::new(
            source,
            "test",
            BTreeMap::from([("bos_token".to_owned(), "<s>".to_owned())]),
        )
        .unwrap()
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = template("{{ x | tojson }}|{{ x | tojson(indent=2) }}");
        let x = json!({"b": [1, 2.5, 1e-7, 1e16, 3.0], "a": "é\"\n\u{1}", "n": null, "t": true, "e": {}, "l": []});
        let out = t
            .render(
                &[],
                &RenderOptions {
                    kwargs: [("x".to_owned(), x)].into_iter().collect(),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, 1e-07, 1e+16, 3.0], \"a\": \"é\\\"\\n\\u0001\", \"n\": null, \"t\": true, \"e\": {}, \"l\": []}|{\n  \"b\": [\n    1,\n    2.5,\n    1e-07,\n    1e+16,\n    3.0\n  ],\n  \"a\": \"é\\\"\\n\\u0001\",\n  \"n\": null,\n  \"t\": true,\n  \"e\": {},\n  \"l\": []\n}"
        );
    }

    #[test]
    fn prints_values_like_python() {
        let t = template("{{ a }} {{ b }} {{ c }} {{ d }} {{ bos_token }}{{ missing }}");
        let kwargs = json!({"a": null, "b": true, "c": {"k": ["v", 1.5]}, "d": 2.0});
        let out = t
            .render(
                &[],
                &RenderOptions {
                    kwargs: kwargs.as_object().unwrap().clone(),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(out, "None True {'k': ['v', 1.5]} 2.0 <s>");
    }

    #[test]
    fn raise_exception_and_syntax_errors_are_reported() {
        let t = template("{% if messages|length == 0 %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}");
        let err = t.render(&[], &RenderOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "chat template (test) raised an exception: Conversation roles must alternate"
        );
        let err = ChatTemplate::new("{% if %}", "bad.jinja", BTreeMap::new())
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("chat template (bad.jinja):"), "{err}");
    }

    #[test]
    fn strftime_now_formats_the_current_date() {
        let t = template("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}");
        let out = t.render(&[], &RenderOptions::default()).unwrap();
        let now = chrono::Local::now();
        let (iso, long) = out.split_once('|').unwrap();
        // Tolerate a midnight between the two clock reads.
        let today = now.format("%Y-%m-%d").to_string();
        let yesterday = (now - chrono::Duration::days(1))
            .format("%Y-%m-%d")
            .to_string();
        assert!(iso == today || iso == yesterday, "{iso}");
        assert_eq!(long.len(), 11, "{long}");
        assert!(
            long.ends_with(&now.format("%Y").to_string())
                || long.ends_with(&(now - chrono::Duration::days(1)).format("%Y").to_string())
        );
    }

    const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn spans_and_continuations() {
        let t = template(CHATML);
        let msgs = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": "hello"}),
            json!({"role": "user", "content": "2+2?"}),
            json!({"role": "assistant", "content": "4"}),
        ];
        let full = t.render(&msgs, &RenderOptions::default()).unwrap();
        let spans = t.assistant_spans(&msgs, &RenderOptions::default()).unwrap();
        let texts: Vec<&str> = spans.iter().map(|s| &full[s.start..s.end]).collect();
        assert_eq!(texts, vec!["hello<|im_end|>", "4<|im_end|>"]);
        let cont = t
            .continuation(
                &msgs[..2],
                &msgs[2..3],
                &RenderOptions {
                    add_generation_prompt: true,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(
            cont,
            "\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
