//! Chat templates: rendering the Jinja template from `tokenizer.chat_template` the way
//! Hugging Face `transformers` does (`trim_blocks` and `lstrip_blocks` on, loop controls,
//! Python string/dict/list methods, `raise_exception`, `tojson`, `strftime_now`).

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::error::TokenizerError;

/// One message of a conversation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant", "tool", ...
    pub role: String,
    /// The message text.
    pub content: String,
    /// The tools an assistant turn called.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` message: the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning, for templates that render it (`reasoning_content`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// A call of a tool, as an assistant turn made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON value (templates render them with `tojson`).
    pub arguments: serde_json::Value,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into(), ..Default::default() }
    }
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }

    /// The message as templates see it: Hugging Face's layout, tool calls as
    /// `{id, type: "function", function: {name, arguments}}`.
    fn template_value(&self) -> Value {
        let mut pairs: Vec<(&str, Value)> =
            vec![("role", Value::from(self.role.as_str())), ("content", Value::from(self.content.as_str()))];
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self
                .tool_calls
                .iter()
                .map(|c| {
                    let function =
                        Value::from_pairs([("name", Value::from(c.name.as_str())), ("arguments", Value::from(Serde(&c.arguments)))]);
                    Value::from_pairs([("id", Value::from(c.id.as_str())), ("type", Value::from("function")), ("function", function)])
                })
                .collect();
            pairs.push(("tool_calls", Value::from(calls)));
        }
        for (k, v) in [("tool_call_id", &self.tool_call_id), ("name", &self.name), ("reasoning_content", &self.reasoning_content)] {
            if let Some(v) = v {
                pairs.push((k, Value::from(v.as_str())));
            }
        }
        Value::from_pairs(pairs)
    }
}

/// What a render passes to the template besides the messages: the tools (OpenAI's
/// `[{type: "function", function: {...}}]` list) and extra variables such as
/// `enable_thinking` (`chat_template_kwargs`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

const RAISE_PREFIX: &str = "raise_exception: ";
const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template with the special-token strings it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

/// Template instructions one render may run: real templates take a few hundred per message,
/// so this covers conversations of thousands of messages and stops loops of millions.
const TEMPLATE_FUEL: u64 = 5_000_000;

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos_token", &self.bos_token).field("eos_token", &self.eos_token).finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token` / `eos_token` are the texts the template sees under
    /// those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Environment::new();
        let syntax =
            SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(|e| TokenizerError::Template(e.to_string()))?;
        env.set_syntax(syntax);
        // templates come from model files: a hostile one must not spin forever
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISE_PREFIX}{msg}")))
        });
        env.add_function("strftime_now", |fmt: String| -> Result<Value, Error> { Ok(Value::from(strftime_now(&fmt))) });
        env.add_template_owned(TEMPLATE_NAME, source.to_string()).map_err(template_error)?;
        Ok(ChatTemplate { env, bos_token: bos_token.to_string(), eos_token: eos_token.to_string() })
    }

    /// Renders the conversation; with `add_generation_prompt` the template appends the
    /// opening of an assistant turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TokenizerError> {
        self.render_with(messages, add_generation_prompt, &ChatOptions::default())
    }

    /// [`ChatTemplate::render`] with tools and extra template variables.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String, TokenizerError> {
        let tmpl = self.env.get_template(TEMPLATE_NAME).map_err(template_error)?;
        // extra variables first: they must not replace the ones every template relies on
        let mut vars: std::collections::BTreeMap<String, Value> =
            options.kwargs.iter().map(|(k, v)| (k.clone(), Value::from(Serde(v)))).collect();
        vars.insert("messages".into(), messages.iter().map(ChatMessage::template_value).collect::<Value>());
        vars.insert("add_generation_prompt".into(), Value::from(add_generation_prompt));
        vars.insert("bos_token".into(), Value::from(self.bos_token.as_str()));
        vars.insert("eos_token".into(), Value::from(self.eos_token.as_str()));
        vars.insert("tools".into(), options.tools.as_ref().map(|t| Value::from(Serde(t))).unwrap_or(Value::from(())));
        vars.insert("documents".into(), Value::from(()));
        tmpl.render(Value::from(vars)).map_err(template_error)
    }

    /// A plain ChatML rendering (`<|im_start|>role\ncontent<|im_end|>\n` per message), for
    /// models that ship no template.
    pub fn fallback_chatml(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
        let mut s = String::new();
        for m in messages {
            s.push_str("<|im_start|>");
            s.push_str(&m.role);
            s.push('\n');
            s.push_str(&m.content);
            s.push_str("<|im_end|>\n");
        }
        if add_generation_prompt {
            s.push_str("<|im_start|>assistant\n");
        }
        s
    }
}

fn template_error(e: Error) -> TokenizerError {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = cur {
        if let Some(me) = err.downcast_ref::<Error>() {
            if let Some(msg) = me.detail().and_then(|d| d.strip_prefix(RAISE_PREFIX)) {
                return TokenizerError::TemplateException(msg.to_string());
            }
        }
        cur = err.source();
    }
    TokenizerError::Template(format!("{e:#}"))
}

/// Today's date/time (UTC) formatted with the common strftime directives
/// (%Y %m %d %e %b %B %a %A %H %M %S %y %j %%); others are kept as written.
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    format_time(secs, fmt)
}

fn format_time(secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] =
        ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // civil-from-days (proleptic Gregorian)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(format_time(0, "%d %b %Y %A"), "01 Jan 1970 Thursday");
        assert_eq!(format_time(951_782_400, "%Y-%m-%d %j %a"), "2000-02-29 060 Tue");
        assert_eq!(format_time(1_767_225_599, "%Y-%m-%d %H:%M:%S"), "2025-12-31 23:59:59");
    }

    #[test]
    fn python_methods_and_trim() {
        let src = "{% for m in messages %}\n  {{ m.role.upper() }}:{{ m.content.strip() }}{% if m.content.strip().startswith('x') %}!{% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t.render(&[ChatMessage::user("  xy "), ChatMessage::assistant("ok")], false).unwrap();
        // what jinja2 (trim_blocks, lstrip_blocks) renders
        assert_eq!(out, "  USER:xy!  ASSISTANT:ok");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('bad role') }}", "", "").unwrap();
        match t.render(&[], false) {
            Err(TokenizerError::TemplateException(m)) => assert_eq!(m, "bad role"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn syntax_error() {
        assert!(matches!(ChatTemplate::new("{% for %}", "", ""), Err(TokenizerError::Template(_))));
    }
}
