from agent_r1.learner.learner import Learner, LearnerConfig, ValueModel, save_hf_checkpoint, token_logprobs

__all__ = ["Learner", "LearnerConfig", "ValueModel", "save_hf_checkpoint", "token_logprobs"]
