python3 -c "
import json
from hypic.models.config import spec_from_config
from hypic.bench.flops import flop_model
f = flop_model(spec_from_config(json.load(open('hypic/models/configs/qwen3_5_35b_a3b.json'))))
n = 64 * 512 + 64
total = f.causal_prefill(n)
attention = f.attention_per_visible_pair * n * (n + 1) / 2
standalone_attention = f.attention_per_visible_pair * 64 * 512 * 513 / 2
print(f'total {total / 1e12:.2f} TFLOP, attention {attention / 1e12:.2f}, standalone attention '
      f'{standalone_attention / 1e12:.2f}, best standalone speedup {total / (total - attention + standalone_attention):.3f}x')
"
