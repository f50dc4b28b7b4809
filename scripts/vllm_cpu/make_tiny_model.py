#!/usr/bin/env python3
"""Build a tiny, randomly initialised Qwen2 chat model fully offline.

- tokenizer: byte-level BPE trained with `tokenizers` on the Python stdlib sources
- wrapped as PreTrainedTokenizerFast with a ChatML-style Jinja chat template
  (system/user/assistant/tool roles, `tools` list, assistant `tool_calls`
  rendered Hermes-style as <tool_call>{json}</tool_call>)
- model: Qwen2ForCausalLM, 2 layers, hidden 128, head_dim 64, random weights, fp32

Usage: <vllm venv>/bin/python make_tiny_model.py [OUT_DIR] [VOCAB_SIZE] [SEED]
(``make_tiny_model.sh`` runs it with the vLLM venv's python into $ROLLOUT_RAY_VLLM_DIR/tiny-model.)
Nothing is downloaded: the weights are random (SEED, default 1234), the tokenizer is trained here
(the same for every seed, so two seeds make two checkpoints of one model: the weight-reload
tests load one into a server started with the other). ~10 s.
"""
import glob
import os
import sys
import sysconfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/rollout-ray-vllm-cpu/tiny-model")
VOCAB = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
SEED = int(sys.argv[3]) if len(sys.argv) > 3 else 1234

# Qwen2's pre-tokenizer regex. transformers>=5 loads a model_type=qwen2 tokenizer as
# Qwen2Tokenizer, which *replaces* normalizer/pre-tokenizer with NFC + this Split + ByteLevel;
# training with the same pipeline keeps vLLM/AutoTokenizer ids identical to the trained tokenizer.
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Not "special" (so they survive skip_special_tokens), but atomic added tokens,
# as in Qwen2.5: vLLM's hermes tool parser looks them up in the vocab.
EXTRA = ["<tool_call>", "</tool_call>"]

CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}
{{- '# Tools\nYou may call one or more functions. Function signatures:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\nReturn each call as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'system' %}
{%- if not loop.first %}{{- '<|im_start|>system\n' + message['content'] + '<|im_end|>\n' }}{%- endif %}
{%- elif message['role'] == 'user' %}
{{- '<|im_start|>user\n' + message['content'] + '<|im_end|>\n' }}
{%- elif message['role'] == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- if message['content'] %}{{- message['content'] }}{%- endif %}
{%- if message['tool_calls'] is defined and message['tool_calls'] %}
{%- for tc in message['tool_calls'] %}
{%- set f = tc['function'] if tc['function'] is defined else tc %}
{{- '\n<tool_call>{"name": "' + f['name'] + '", "arguments": ' }}
{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}
{{- '}</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message['role'] == 'tool' %}
{{- '<|im_start|>tool\n' + message['content'] + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""


def corpus_files(limit=400):
    std = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(std, "*.py")))
    return files[:limit]


def build_tokenizer():
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes -> no UNK
        show_progress=False,
    )
    tok.train(corpus_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(EXTRA, special_tokens=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main():
    torch.manual_seed(SEED)
    tok = build_tokenizer()
    vocab = len(tok)
    # round the embedding size up to a multiple of 64 (extra rows are never produced by the tokenizer)
    padded = (vocab + 63) // 64 * 64
    cfg = Qwen2Config(
        vocab_size=padded,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # keep a head size the CPU attention kernels support
        max_position_embeddings=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(cfg).to(torch.float32)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=cfg.bos_token_id,
        eos_token_id=[cfg.eos_token_id, cfg.pad_token_id],
        pad_token_id=cfg.pad_token_id,
    )
    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    tok.save_pretrained(OUT)

    # sanity checks: reload the way vLLM does (AutoTokenizer), compare with the trained tokenizer,
    # and run a forward pass
    tok2 = AutoTokenizer.from_pretrained(OUT)
    raw = Tokenizer.from_file(os.path.join(OUT, "tokenizer.json"))
    sample = open(corpus_files(2000)[-1], encoding="utf-8").read()[:20000] + " h\u00e9llo \U0001F642 <tool_call>{}</tool_call><|im_end|>"
    a = tok2(sample, add_special_tokens=False)["input_ids"]
    b = raw.encode(sample, add_special_tokens=False).ids
    assert a == b, f"{type(tok2).__name__} tokenizes differently from the trained tokenizer"
    assert tok2.decode(a) == sample
    msgs = [{"role": "system", "content": "You are tiny."}, {"role": "user", "content": "def f(x): return x"}]
    text = tok2.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = tok2(text, add_special_tokens=False)["input_ids"]
    assert tok2.decode(ids) == text, (tok2.decode(ids), text)
    with torch.no_grad():
        logits = Qwen2ForCausalLM.from_pretrained(OUT)(torch.tensor([ids])).logits
    n_params = sum(p.numel() for p in model.parameters())
    print(f"saved to {OUT}: {type(tok2).__name__} vocab={vocab} (embedding rows {padded}), params={n_params}, "
          f"prompt tokens={len(ids)}, logits={tuple(logits.shape)}")


if __name__ == "__main__":
    main()
