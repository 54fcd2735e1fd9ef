"""Step/Trajectory records: parquet round trip and packing into the learner's TrainBatch."""

import torch

from agent_r1.trajectory import Step, Trajectory, collate, from_frame, load_parquet, save_parquet, to_frame, to_sequences

PAD = 0
P = [11, 12, 13]  # prompt
A0, O0 = [21, 22], [31, 32, 33]  # first action, its observation
A1, O1 = [41, 42, 43], [51]
A2 = [61]


def full_history() -> Trajectory:
    """Three turns, each context = previous context + action + observation."""
    c0, c1 = P, P + A0 + O0
    c2 = c1 + A1 + O1
    return Trajectory(
        task_id="t",
        group_id=7,
        steps=[
            Step(c0, A0, [-0.1, -0.2], reward=0.5),
            Step(c1, A1, [-0.3, -0.4, -0.5], reward=0.25),
            Step(c2, A2, [-0.6], reward=0.0),
        ],
        final_reward=1.0,
    )


def sliding_window() -> Trajectory:
    """Window of 1 turn: the third context drops the first turn, so it is not a prefix chain."""
    c0, c1 = P, P + A0 + O0
    c2 = P + A1 + O1
    return Trajectory(
        task_id="s",
        group_id=3,
        steps=[
            Step(c0, A0, [-0.1, -0.2], reward=0.5),
            Step(c1, A1, [-0.3, -0.4, -0.5], reward=0.25),
            Step(c2, A2, [-0.6], reward=0.125),
        ],
        final_reward=1.0,
    )


def test_parquet_round_trip_keeps_every_field(tmp_path):
    trajs = [
        Trajectory(
            task_id="q1",
            group_id=4,
            steps=[
                Step(
                    [1, 2, 3],
                    [4, 5],
                    [-0.125, -2.5],
                    action_text='<tool_call>{"name": "search"}</tool_call> é',
                    tool_calls=[{"name": "search", "arguments": {"query": "Mona Lisa", "k": [1, 2]}}],
                    observation=[{"role": "tool", "name": "search", "content": "(1) Louvre: …"}],
                    reward=0.5,
                    format_error=True,
                    tool_errors=2,
                    hit_max_new_tokens=True,
                ),
                Step([1, 2, 3, 4, 5, 9], [6], [-0.75], action_text="<answer>x</answer>"),
            ],
            final_reward=-1.0,
            stop_reason="answer",
            answer="x",
            metrics={"em": 0.0, "tool_calls": 1},
            metric_aggs={"em": "mean"},
        ),
        Trajectory(task_id="q2", group_id=4, steps=[Step([7], [8, 2], [-1e-9, -30.0])], final_reward=0.0,
                   stop_reason="env_error", error="ValueError: boom"),
    ]
    path = tmp_path / "rollouts" / "iteration_00001.parquet"
    save_parquet(trajs, path)
    back = load_parquet(path)
    assert back == trajs
    # flags survive with their Python types, not numpy ones
    s = back[0].steps[0]
    assert type(s.format_error) is bool and type(s.hit_max_new_tokens) is bool and type(s.tool_errors) is int
    assert from_frame(to_frame(back)) == trajs
    assert from_frame(to_frame([])) == []


def test_full_history_is_one_sequence_with_actions_and_rewards_in_place():
    traj = full_history()
    (seq,) = to_sequences(traj)
    assert seq.ids == P + A0 + O0 + A1 + O1 + A2
    n0 = len(P)
    n1 = n0 + len(A0) + len(O0)
    n2 = n1 + len(A1) + len(O1)
    action = [0] * len(seq.ids)
    for start, a in ((n0, A0), (n1, A1), (n2, A2)):
        action[start : start + len(a)] = [1] * len(a)
    assert seq.action == action
    # sampled ids sit exactly at the marked positions
    assert [i for i, m in zip(seq.ids, seq.action) if m] == A0 + A1 + A2
    assert seq.step_ids == [-1] * 3 + [0, 0] + [-1] * 3 + [1, 1, 1] + [-1] + [2]
    assert seq.sample_logprobs == [0.0] * 3 + [-0.1, -0.2] + [0.0] * 3 + [-0.3, -0.4, -0.5] + [0.0] + [-0.6]
    rewards = [0.0] * len(seq.ids)
    rewards[n0 + len(A0) - 1] = 0.5  # step 0's reward on its last action token
    rewards[n1 + len(A1) - 1] = 0.25  # step 1's
    rewards[n2 + len(A2) - 1] = 0.0 + 1.0  # step 2's reward + the final reward on the last token
    assert seq.rewards == rewards
    assert seq.prompt_len == len(P) and seq.group_id == 7


def test_sliding_window_gives_one_sequence_per_step_with_return_to_go():
    traj = sliding_window()
    seqs = to_sequences(traj)
    assert len(seqs) == 3
    returns = [1.0 + 0.125 + 0.25 + 0.5, 1.0 + 0.125 + 0.25, 1.0 + 0.125]
    for k, (seq, step, ret) in enumerate(zip(seqs, traj.steps, returns)):
        c, a = len(step.context_ids), len(step.action_ids)
        assert seq.ids == step.context_ids + step.action_ids
        assert seq.action == [0] * c + [1] * a
        assert seq.step_ids == [-1] * c + [k] * a
        assert seq.rewards == [0.0] * (c + a - 1) + [ret]
        assert seq.sample_logprobs == [0.0] * c + step.action_logprobs
        assert seq.prompt_len == c and seq.group_id == 3


def test_collate_pads_and_widens_masks_when_ablated():
    seqs = to_sequences(full_history()) + to_sequences(sliding_window())[:1]
    long, short = seqs[0], seqs[1]
    T = len(long.ids)
    masked = collate(seqs, PAD)
    assert masked.input_ids.shape == (2, T)
    assert masked.input_ids[1, len(short.ids) :].eq(PAD).all()
    assert masked.attention_mask.sum(1).tolist() == [T, len(short.ids)]
    assert masked.group_ids.tolist() == [7, 3]
    action = torch.tensor(long.action, dtype=torch.float)
    assert torch.equal(masked.loss_mask[0], action) and torch.equal(masked.adv_mask[0], action)
    assert torch.equal(masked.token_rewards[0], torch.tensor(long.rewards))
    assert masked.step_ids[1, len(short.ids) :].eq(-1).all()

    wide = collate(seqs, PAD, loss_mask=False, adv_mask=False)
    after_prompt = torch.zeros(2, T)
    after_prompt[0, len(P) : T] = 1
    after_prompt[1, len(P) : len(short.ids)] = 1
    assert torch.equal(wide.loss_mask, after_prompt)
    assert torch.equal(wide.adv_mask, after_prompt)
    # the widened masks cover the observation tokens that the action mask leaves out
    obs = (wide.loss_mask == 1) & (wide.action_mask == 0)
    assert obs[0].sum() == len(O0) + len(O1)
    # one mask can be widened alone
    only_loss = collate(seqs, PAD, loss_mask=False, adv_mask=True)
    assert torch.equal(only_loss.loss_mask, after_prompt)
    assert torch.equal(only_loss.adv_mask, masked.action_mask)


def test_episode_ids_round_trip_through_collate_and_select():
    seqs = to_sequences(full_history(), episode_id=4) + to_sequences(sliding_window(), episode_id=9)
    assert [s.episode_id for s in seqs] == [4, 9, 9, 9]
    batch = collate(seqs, PAD)
    assert batch.episode_ids.dtype == torch.long and batch.episode_ids.tolist() == [4, 9, 9, 9]
    part = batch.select(torch.tensor([3, 0]))
    assert part.episode_ids.tolist() == [9, 4] and part.group_ids.tolist() == [3, 7]
    # a sequence without an episode is an episode of its own
    assert collate(to_sequences(sliding_window()), PAD).episode_ids.tolist() == [-1, -2, -3]
