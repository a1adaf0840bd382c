"""Write support_trace.csv, the small trace that plan_from_trace.py plans from (run once; the file is committed).

A support assistant: 40% of requests repeat one of 12 frequently asked questions word for word (a shared
prompt_id, so a prefix cache can serve them), the rest are unique prompts. Poisson arrivals at 2 requests/s.

    python examples/make_trace.py            # rewrites examples/support_trace.csv, identical every time
"""

import csv
from pathlib import Path

import numpy as np

ROWS = 200
rng = np.random.default_rng(2024)  # fixed seed: the same file on every run
faq_tokens = rng.integers(600, 1800, size=12)  # one prompt length per FAQ (same id, same prompt)

arrival_s = 0.0
rows = []
for i in range(ROWS):
    arrival_s += rng.exponential(1 / 2.0)
    if rng.random() < 0.4:
        faq = int(rng.integers(12))
        prompt_id, prompt_tokens = f"faq-{faq}", int(faq_tokens[faq])
    else:
        prompt_id, prompt_tokens = "", int(rng.lognormal(np.log(900), 0.6))  # empty id: a prompt of its own
    output_tokens = max(1, int(rng.lognormal(np.log(200), 0.7)))
    rows.append((f"{arrival_s:.3f}", prompt_tokens, output_tokens, prompt_id))

path = Path(__file__).with_name("support_trace.csv")
with path.open("w", newline="") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(("arrival_s", "prompt_tokens", "output_tokens", "prompt_id"))
    writer.writerows(rows)
print(f"wrote {ROWS} requests to {path}")
