//! τ-bench-style customer service with a simulated user ([`crate::retail`]): the policy is the
//! store's agent; a helper model named `user` plays the customer, given the scenario's hidden
//! goal; the reward is τ-bench's (the database the agent left equals the goal's, and every
//! required fact was said).
//!
//! An execution: the user simulator answers the agent's greeting with its opening message; then
//! each policy turn is either a tool call, `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
//! (generation stops at the closing tag; the result, or what was wrong with the call, comes back
//! as a `tool` message, cut to `max_observation_tokens`), or, when the model ends its turn, a
//! message to the customer, which the user simulator answers as a `user` message. It ends when the customer's reply holds `###STOP###`, the agent transfers
//! to a human, the turns run out, or the response budget does. Tool results and the customer's
//! messages are appended with loss mask 0; one conversation, one sample.
//!
//! The user simulator sees its own conversation: its system prompt with the goal, the agent's
//! messages as `user` turns and its own earlier replies as `assistant` turns; its replies are cut
//! at the helper's `max_tokens`.

use crate::parse::tool_calls;
use crate::retail::scenario::{user_system_prompt, Identity, Request, Scenario, GREETING, STOP};
use crate::retail::{tools, Database};
use ooze_core::{FinishReason, StopMatch};
use ooze_rollout::agent::{Agent, AgentContext, AgentError, AgentFuture, AgentOutput};
use ooze_rollout::oracle::{Caller, Oracle};
use ooze_rollout::prompts::PromptItem;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The helper that plays the customer.
pub const USER: &str = "user";

#[derive(Debug, Clone)]
pub struct TauRetailConfig {
    /// Policy turns at most (tool calls and messages to the customer).
    pub max_turns: usize,
    /// Tokens of a tool's result kept.
    pub max_observation_tokens: usize,
}

pub struct TauRetailAgent {
    pub config: TauRetailConfig,
}

fn agent_error(e: impl std::fmt::Display) -> AgentError {
    AgentError::Agent(e.to_string())
}

/// The scenario of a row.
pub fn scenario(prompt: &PromptItem) -> Result<Scenario, AgentError> {
    Scenario::from_metadata(&prompt.metadata)
        .map_err(|e| agent_error(format!("prompt at line {}: {e}", prompt.source_line)))
}

impl Agent for TauRetailAgent {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let scenario = scenario(prompt)?;
            let mut messages = prompt.messages.clone();
            if messages.is_empty() {
                return Err(agent_error(format!(
                    "prompt at line {}: tau_retail needs chat messages (the policy document as \
                     the system message) in the row's prompt",
                    prompt.source_line
                )));
            }
            let mut db = Database::generate(scenario.db_seed);
            let mut customer = vec![
                json!({"role": "system", "content": user_system_prompt(&scenario.instruction)}),
                json!({"role": "user", "content": GREETING}),
            ];
            let opening = ctx.ask_helper(USER, &customer, usize::MAX, &[]).await?.text;
            customer.push(json!({"role": "assistant", "content": opening}));
            messages.push(json!({"role": "user", "content": opening}));
            let mut conv = ctx.start(messages, None)?;
            let mut said: Vec<String> = Vec::new();
            let mut m = Counts::default();
            let mut stopped = opening.contains(STOP);
            let mut ended = stopped;
            while !ended && m.turns < self.config.max_turns {
                let turn = ctx.generate(&mut conv, &["</tool_call>"]).await?;
                m.turns += 1;
                if turn.tokens == 0 || turn.finish == FinishReason::Length {
                    break;
                }
                let closed = matches!(
                    turn.finish,
                    FinishReason::Stop {
                        matched: StopMatch::Token(_)
                    }
                );
                let message = if closed {
                    // A message to the customer (the model ended its turn), who answers it.
                    said.push(turn.text.clone());
                    customer.push(json!({"role": "user", "content": turn.text}));
                    let reply = ctx.ask_helper(USER, &customer, usize::MAX, &[]).await?.text;
                    customer.push(json!({"role": "assistant", "content": reply}));
                    m.user_turns += 1;
                    stopped = reply.contains(STOP);
                    ended = stopped;
                    json!({"role": "user", "content": reply})
                } else {
                    // The turn stopped at `</tool_call>`: a tool call.
                    m.tool_calls += 1;
                    let result = match tool_calls(&turn.text).into_iter().next() {
                        Some(Ok(call)) => {
                            ended = call.name == "transfer_to_human_agents";
                            m.transfers += ended as usize;
                            let result = tools::call(&mut db, &call.name, &call.arguments);
                            m.writes += (result.is_ok() && tools::writes(&call.name)) as usize;
                            result
                        }
                        Some(Err(e)) => Err(e.0),
                        None => Err("no tool call before </tool_call>".to_owned()),
                    };
                    let text = result.unwrap_or_else(|e| {
                        m.tool_errors += 1;
                        format!("Error: {e}")
                    });
                    let text = ctx.truncate(&text, self.config.max_observation_tokens)?;
                    json!({"role": "tool", "content": text})
                };
                if !ended {
                    ctx.append_message(&mut conv, message)?;
                }
            }
            let grade = scenario.grade(&db, &said).map_err(agent_error)?;
            let metrics = BTreeMap::from([
                ("turns".to_string(), m.turns as f64),
                ("tool_calls".to_string(), m.tool_calls as f64),
                ("tool_errors".to_string(), m.tool_errors as f64),
                ("writes".to_string(), m.writes as f64),
                ("user_turns".to_string(), m.user_turns as f64),
                ("transfers".to_string(), m.transfers as f64),
                ("user_stopped".to_string(), stopped as u8 as f64),
                (
                    "database_matches".to_string(),
                    grade.database_matches as u8 as f64,
                ),
                (
                    "outputs_found".to_string(),
                    grade.outputs_found as f64 / grade.outputs.max(1) as f64,
                ),
                ("passed".to_string(), grade.reward()),
            ]);
            let response = conv.response_text(ctx.tokenizer())?;
            Ok(AgentOutput {
                samples: vec![conv.sample],
                reward: Some(grade.reward()),
                final_response: Some(response),
                metrics,
            })
        })
    }
}

#[derive(Default)]
struct Counts {
    turns: usize,
    tool_calls: usize,
    tool_errors: usize,
    /// Changes the store accepted.
    writes: usize,
    user_turns: usize,
    transfers: usize,
}

/// `n` rows of generated scenarios: the policy document as the system message, the scenario in
/// `extra_info.scenario` (the agent's reward comes from it; `label` is for the recipe's fallback
/// scorer).
pub fn synthetic(n: usize, seed: u64) -> Vec<Value> {
    let policy = crate::retail::scenario::policy_document();
    (0..n as u64)
        .map(|i| {
            let s = Scenario::generate(seed.wrapping_mul(1_000_003).wrapping_add(i));
            json!({
                "data_source": "ooze_synthetic_tau_retail",
                "prompt": [{"role": "system", "content": policy}],
                // What the fallback scorer would compare: the facts to say, else the database.
                "label": if s.outputs.is_empty() { "database".to_owned() } else { s.outputs.join(" ") },
                "extra_info": {"index": i, "scenario": s},
            })
        })
        .collect()
}

/// The demonstrations' teacher: it plays the store's agent and the customer, knowing the
/// scenario. The agent finds the user id, looks the order (or the account, and for an exchange
/// the product) up, states the change and asks for confirmation, makes it, and reports; for a
/// question it reports the fact. The customer opens with the whole request and their identity,
/// says yes to a question, and ends the conversation after any other message.
///
/// On a third of the scenarios (a hash of the goal) the agent is careless in its one change: the
/// other cancellation reason, every item of the order returned, the first other available variant
/// in an exchange, the customer's old zip code kept with a new address, the first item's price
/// as an order's total. Its change is then usually wrong (the reward 0), so the warm-started
/// policy starts imperfect and RL has the careful habit to find.
pub struct TauRetailOracle {
    scenario: Scenario,
    db: Database,
    careless: bool,
}

impl TauRetailOracle {
    pub fn new(prompt: &PromptItem) -> Result<TauRetailOracle, AgentError> {
        let scenario = scenario(prompt)?;
        Ok(TauRetailOracle {
            db: Database::generate(scenario.db_seed),
            careless: super::strategy(&scenario.instruction, 3) == 0,
            scenario,
        })
    }

    fn call(name: &str, arguments: Value) -> String {
        format!(
            "<tool_call>{}</tool_call>",
            json!({"name": name, "arguments": arguments})
        )
    }

    /// The agent's turns, in order.
    fn script(&self) -> Vec<String> {
        let s = &self.scenario;
        let identify = match &s.identity {
            Identity::Email { email } => {
                Self::call("find_user_id_by_email", json!({ "email": email }))
            }
            Identity::NameZip {
                first_name,
                last_name,
                zip,
            } => Self::call(
                "find_user_id_by_name_zip",
                json!({"first_name": first_name, "last_name": last_name, "zip": zip}),
            ),
        };
        let mut turns = vec![identify];
        let order = |id: &str| Self::call("get_order_details", json!({ "order_id": id }));
        match &s.request {
            Request::UserAddress { .. } => turns.push(Self::call(
                "get_user_details",
                json!({"user_id": s.user_id}),
            )),
            Request::Cancel { order_id, .. }
            | Request::OrderAddress { order_id, .. }
            | Request::Return { order_id, .. }
            | Request::OrderTotal { order_id } => turns.push(order(order_id)),
            Request::Exchange {
                order_id,
                product_id,
                ..
            } => {
                turns.push(order(order_id));
                turns.push(Self::call(
                    "get_product_details",
                    json!({ "product_id": product_id }),
                ));
            }
        }
        if let Request::OrderTotal { order_id } = &s.request {
            let o = &self.db.orders[order_id];
            let total = if self.careless {
                o.items[0].price
            } else {
                o.total()
            };
            turns.push(format!(
                "The total of order {order_id} is {}.",
                crate::retail::db::dollars(total)
            ));
            return turns;
        }
        let action = self.action();
        turns.push(format!(
            "I will call {} with {}. Shall I proceed?",
            action["name"].as_str().unwrap_or(""),
            action["arguments"]
        ));
        turns.push(format!("<tool_call>{action}</tool_call>"));
        turns.push("Done: your request went through.".to_owned());
        turns
    }

    /// The one change, careful or careless.
    fn action(&self) -> Value {
        let gold = &self.scenario.actions[0];
        let mut args = Value::Object(gold.arguments.clone());
        if self.careless {
            match &self.scenario.request {
                Request::Cancel { reason, .. } => {
                    let other = tools::CANCEL_REASONS
                        .iter()
                        .find(|r| *r != reason)
                        .expect("two reasons");
                    args["reason"] = json!(other);
                }
                Request::Return { order_id, .. } => {
                    let items: Vec<_> = self.db.orders[order_id]
                        .items
                        .iter()
                        .map(|i| i.item_id.clone())
                        .collect();
                    args["item_ids"] = json!(items);
                }
                Request::Exchange {
                    item_id,
                    product_id,
                    ..
                } => {
                    if let Some(v) = self.db.products[product_id]
                        .variants
                        .iter()
                        .find(|v| v.available && &v.item_id != item_id)
                    {
                        args["new_item_ids"] = json!([v.item_id]);
                    }
                }
                Request::OrderAddress { .. } | Request::UserAddress { .. } => {
                    let user = &self.db.users[&self.scenario.user_id];
                    args["zip"] = json!(user.address.zip);
                }
                Request::OrderTotal { .. } => {}
            }
        }
        json!({"name": gold.name, "arguments": args})
    }

    /// The customer's opening: the request with their identity.
    fn opening(&self) -> String {
        let s = &self.scenario;
        let who = match &s.identity {
            Identity::Email { email } => {
                format!("My email is {email}.")
            }
            Identity::NameZip {
                first_name,
                last_name,
                zip,
            } => format!("I'm {first_name} {last_name}, zip code {zip}."),
        };
        // The goal in the first person.
        let want = s
            .instruction
            .split_once("You want to ")
            .map_or(s.instruction.as_str(), |(_, w)| w)
            .trim_end_matches('.')
            .replace("your ", "my ")
            .replace("you ", "I ");
        format!("Hi, I want to {want}. {who}")
    }
}

impl Oracle for TauRetailOracle {
    fn reply(&self, caller: Caller<'_>, messages: &[Value]) -> Result<String, String> {
        match caller {
            Caller::Policy => {
                let done = messages.iter().filter(|m| m["role"] == "assistant").count();
                self.script()
                    .get(done)
                    .cloned()
                    .ok_or_else(|| format!("the demonstration has {done} agent turns already"))
            }
            Caller::Helper(USER) => {
                let asked = super::last_text(messages);
                Ok(if asked == GREETING {
                    self.opening()
                } else if asked.trim_end().ends_with('?') {
                    "Yes, please go ahead.".to_owned()
                } else {
                    format!("Thank you, that's all. {STOP}")
                })
            }
            Caller::Helper(name) => Err(format!(
                "tau_retail asks only the helper \"{USER}\", yet \"{name}\" was asked"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retail::scenario::policy_document;

    /// Plays the oracle's script against the environment, as the agent would.
    fn play(oracle: &TauRetailOracle) -> f64 {
        let mut db = Database::generate(oracle.scenario.db_seed);
        let mut said = Vec::new();
        for turn in oracle.script() {
            match tool_calls(&turn).into_iter().next() {
                Some(call) => {
                    let call = call.unwrap();
                    tools::call(&mut db, &call.name, &call.arguments).unwrap();
                }
                None => said.push(turn),
            }
        }
        oracle.scenario.grade(&db, &said).unwrap().reward()
    }

    #[test]
    fn the_careful_script_solves_every_scenario_and_the_careless_one_mostly_fails() {
        let rows = synthetic(200, 1);
        let (mut careless, mut careless_right) = (0, 0);
        for row in &rows {
            let prompt = super::super::test_prompt(
                String::new(),
                row["extra_info"].clone(),
                row["prompt"].as_array().unwrap().clone(),
            );
            let mut oracle = TauRetailOracle::new(&prompt).unwrap();
            let was_careless = oracle.careless;
            oracle.careless = false;
            assert_eq!(play(&oracle), 1.0, "{:?}", oracle.scenario);
            if was_careless {
                careless += 1;
                oracle.careless = true;
                careless_right += play(&oracle) as usize;
            }
        }
        assert!((40..=95).contains(&careless), "{careless} careless of 200");
        assert!(
            careless_right * 3 < careless,
            "{careless_right} of {careless} careless scripts still right"
        );
        assert!(rows[0]["prompt"][0]["content"]
            .as_str()
            .unwrap()
            .starts_with(&policy_document()[..40]));
    }

    #[test]
    fn the_customer_opens_confirms_and_stops() {
        let rows = synthetic(1, 2);
        let prompt = super::super::test_prompt(
            String::new(),
            rows[0]["extra_info"].clone(),
            rows[0]["prompt"].as_array().unwrap().clone(),
        );
        let oracle = TauRetailOracle::new(&prompt).unwrap();
        let ask = |text: &str| {
            oracle
                .reply(
                    Caller::Helper(USER),
                    &[json!({"role": "user", "content": text})],
                )
                .unwrap()
        };
        let opening = ask(GREETING);
        assert!(opening.starts_with("Hi, I want to "), "{opening}");
        assert!(!opening.contains(STOP));
        assert_eq!(ask("Shall I proceed?"), "Yes, please go ahead.");
        assert!(ask("Done.").ends_with(STOP));
        let e = oracle
            .reply(Caller::Helper("judge"), &[json!({"role": "user"})])
            .unwrap_err();
        assert!(e.contains("only the helper \"user\""), "{e}");
    }
}
