//! Agent profiles (`[[agents]]`): named kinds of agent an operator defines — what they are
//! told, which model they use, which tools they may call — that `session/open {agent}` and
//! `spawn_agent {agent_type}` pick.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::tools::policy::ToolPolicy;

/// One `[[agents]]` entry.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentProfile {
    /// What `session/open {agent}` and `spawn_agent {agent_type}` name it by.
    pub name: String,
    /// One line for people and for the model choosing a sub-agent.
    #[serde(default)]
    pub description: String,
    /// Told to the agent after the operator's instructions and before the repository's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Its model (`<provider>/<model>`), unless the session or the turn chose one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Narrows the tools on top of `[tool_policy]` (its `allow`, `deny` and `require_tags`;
    /// approval rules stay server-wide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_policy: Option<ToolPolicy>,
}

/// What `agent/list` tells of a profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileInfo {
    /// Its name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// Its model, when it sets one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// The configured profiles, looked up by name.
#[derive(Debug, Clone, Default)]
pub struct Profiles(Arc<[AgentProfile]>);

impl Profiles {
    /// The profiles of `[[agents]]`.
    pub fn new(profiles: Vec<AgentProfile>) -> Self {
        Self(profiles.into())
    }

    /// The profile `name`, or an error naming the ones there are.
    pub fn get(&self, name: &str) -> Result<&AgentProfile, UnknownProfile> {
        self.0
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| UnknownProfile {
                name: name.to_string(),
                configured: self.0.iter().map(|p| p.name.clone()).collect(),
            })
    }

    /// Every profile, for `agent/list`.
    pub fn list(&self) -> Vec<ProfileInfo> {
        self.0
            .iter()
            .map(|p| ProfileInfo {
                name: p.name.clone(),
                description: p.description.clone(),
                model: p.model.clone(),
            })
            .collect()
    }

    /// Every profile.
    pub fn all(&self) -> &[AgentProfile] {
        &self.0
    }
}

/// A profile name `[[agents]]` does not have; it says which it has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown agent {name:?}{}", match configured.as_slice() {
    [] => ": no [[agents]] profiles are configured".to_string(),
    names => format!("; the configured profiles are {}", names.join(", ")),
})]
pub struct UnknownProfile {
    /// The name asked for.
    pub name: String,
    /// The names there are.
    pub configured: Vec<String>,
}

/// Why `[[agents]]` is refused at start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidProfile {
    /// A name that is empty, too long, or of other characters.
    #[error("agents: the name {0:?} must be 1 to 64 letters, digits, '-' or '_'")]
    BadName(String),
    /// Two profiles of one name.
    #[error("agents: the name {0:?} is used twice")]
    Twice(String),
    /// A profile's policy with approval rules, which are server-wide.
    #[error(
        "agents {0:?}: tool_policy takes allow, deny and require_tags; approval rules (ask, commands) belong in [tool_policy]"
    )]
    ApprovalRules(String),
}

/// Checks `[[agents]]`: names present, unique, of letters, digits, `-` and `_`, at most 64
/// characters; a policy without approval rules (those are server-wide).
pub fn validate(profiles: &[AgentProfile]) -> Result<(), InvalidProfile> {
    let mut seen = std::collections::HashSet::new();
    for profile in profiles {
        let name = &profile.name;
        let well_formed = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !well_formed {
            return Err(InvalidProfile::BadName(name.clone()));
        }
        if !seen.insert(name.as_str()) {
            return Err(InvalidProfile::Twice(name.clone()));
        }
        if let Some(policy) = &profile.tool_policy
            && (!policy.ask.is_empty() || !policy.commands.is_empty())
        {
            return Err(InvalidProfile::ApprovalRules(name.clone()));
        }
    }
    Ok(())
}

/// The operator's instructions followed by a profile's, as the agent is told them.
pub fn with_profile(operator: Option<&str>, profile: Option<&AgentProfile>) -> Option<String> {
    let own = profile.and_then(|p| p.instructions.as_deref());
    match (operator, own) {
        (Some(operator), Some(own)) => Some(format!("{operator}\n\n{own}")),
        (Some(text), None) | (None, Some(text)) => Some(text.to_string()),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(name: &str) -> AgentProfile {
        AgentProfile {
            name: name.into(),
            description: String::new(),
            instructions: None,
            model: None,
            tool_policy: None,
        }
    }

    #[test]
    fn names_are_checked_and_lookups_name_the_choices() {
        assert!(validate(&[profile("reviewer"), profile("docs_writer-2")]).is_ok());
        assert!(
            validate(&[profile("")])
                .unwrap_err()
                .to_string()
                .contains("1 to 64")
        );
        assert!(validate(&[profile("a b")]).is_err());
        assert!(
            validate(&[profile("x"), profile("x")])
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
        let mut asking = profile("asker");
        asking.tool_policy = Some(ToolPolicy {
            ask: vec!["shell".into()],
            ..ToolPolicy::default()
        });
        assert!(
            validate(&[asking])
                .unwrap_err()
                .to_string()
                .contains("[tool_policy]")
        );
        let profiles = Profiles::new(vec![profile("reviewer")]);
        assert_eq!(profiles.get("reviewer").unwrap().name, "reviewer");
        assert_eq!(
            profiles.get("writer").unwrap_err().to_string(),
            "unknown agent \"writer\"; the configured profiles are reviewer"
        );
        assert_eq!(
            Profiles::default().get("x").unwrap_err().to_string(),
            "unknown agent \"x\": no [[agents]] profiles are configured"
        );
    }

    #[test]
    fn a_profiles_instructions_follow_the_operators() {
        let mut reviewer = profile("reviewer");
        reviewer.instructions = Some("Review only.".into());
        assert_eq!(
            with_profile(Some("Be brief."), Some(&reviewer)).as_deref(),
            Some("Be brief.\n\nReview only.")
        );
        assert_eq!(
            with_profile(None, Some(&reviewer)).as_deref(),
            Some("Review only.")
        );
        assert_eq!(
            with_profile(Some("Be brief."), None).as_deref(),
            Some("Be brief.")
        );
    }
}
