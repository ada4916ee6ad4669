"""Generate the licence-clean sample inputs and ``jobs/demo.toml``, deterministically.

Run from anywhere: ``python scripts/make_samples.py``. Every name, address and number is
made up from a seeded ``random.Random(42)``; running it twice gives identical files.
"""

from __future__ import annotations

import csv
import io
import json
import random
from decimal import Decimal
from pathlib import Path

from reportlab.lib.pagesizes import A4
from reportlab.pdfgen.canvas import Canvas

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample-inputs"
JOBS = ROOT / "jobs"
INVOICE_COUNT = 50
LONG_INVOICES = {7: 65, 23: 120}  # invoice number -> item count (multi-page invoices)

_COMPANY_A = (
    "Northwind",
    "Bluebird",
    "Harbor",
    "Granite",
    "Silverline",
    "Maple",
    "Copper",
    "Juniper",
    "Lakeside",
    "Summit",
    "Orchard",
    "Beacon",
)
_COMPANY_B = (
    "Traders",
    "Supplies",
    "Logistics",
    "Analytics",
    "Works",
    "Studio",
    "Foods",
    "Outfitters",
    "Systems",
    "Partners",
)
_SUFFIX = ("GmbH", "Ltd", "SARL", "B.V.", "Inc.", "S.L.", "AB", "Oy")
_STREETS = (
    "Market Street",
    "Station Road",
    "Rue des Lilas",
    "Hauptstrasse",
    "Kerkstraat",
    "Calle Mayor",
    "Storgatan",
    "Via Roma",
    "Mill Lane",
    "Harbour Quay",
)
_CITIES = (
    ("10115", "Berlin"),
    ("75011", "Paris"),
    ("1012 AB", "Amsterdam"),
    ("28013", "Madrid"),
    ("111 52", "Stockholm"),
    ("00184", "Roma"),
    ("EC1A 1BB", "London"),
    ("00100", "Helsinki"),
)
_PRODUCTS = (
    "Consulting hours",
    "Annual support plan",
    "Laser printer toner",
    "Ergonomic office chair",
    "Standing desk frame",
    "USB-C docking station",
    "Cloud storage (1 TB, monthly)",
    "On-site installation",
    "Training workshop (half day)",
    "Shipping and handling",
    "Replacement keyboard",
    "27-inch monitor",
    "Network switch, 24 ports",
    "Software licence, per seat",
    "Paper, A4, 5 reams",
)
_CURRENCIES = ("EUR", "EUR", "EUR", "GBP", "USD", "SEK")
_RATES = {
    "EUR": ("0.19", "0.07", "0"),
    "GBP": ("0.2", "0"),
    "USD": ("0.0825", "0"),
    "SEK": ("0.25", "0.12"),
}
_REGIONS = ("North", "South", "East", "West", "Central")


def _company(rng: random.Random) -> str:
    return f"{rng.choice(_COMPANY_A)} {rng.choice(_COMPANY_B)} {rng.choice(_SUFFIX)}"


def _address(rng: random.Random) -> list[str]:
    postcode, city = rng.choice(_CITIES)
    return [f"{rng.randint(1, 220)} {rng.choice(_STREETS)}", f"{postcode} {city}"]


def _invoice(rng: random.Random, n: int) -> dict[str, object]:
    currency = rng.choice(_CURRENCIES)
    month, day = rng.randint(1, 12), rng.randint(1, 28)
    items = []
    for _ in range(LONG_INVOICES.get(n, rng.randint(1, 8))):
        price = Decimal(rng.randint(150, 250_000)) / 100
        items.append(
            {
                "description": rng.choice(_PRODUCTS),
                "quantity": rng.choice((1, 1, 2, 3, 5, 10, "0.5", "1.25")),
                "unit_price": str(price),
                "tax_rate": rng.choice(_RATES[currency]),
            }
        )
    doc: dict[str, object] = {
        "number": f"INV-2025-{n:04d}",
        "date": f"2025-{month:02d}-{day:02d}",
        "due_date": f"2025-{month:02d}-{min(28, day + 14):02d}" if day <= 14 else None,
        "currency": currency,
        "seller": {
            "name": "Example Office Supply Ltd",
            "address": ["12 Sample Street", "EC1A 1BB London", "United Kingdom"],
            "vat_id": "GB000000000",
        },
        "customer": {"name": _company(rng), "address": _address(rng)},
        "items": items,
    }
    if doc["due_date"] is None:
        del doc["due_date"]
    if rng.random() < 0.4:
        doc["notes"] = "Payment by bank transfer within 30 days.\nThank you for your business."
    return doc


def _csv_text(header: list[str], rows: list[list[object]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def _sales(rng: random.Random) -> str:
    rows: list[list[object]] = []
    for _ in range(200):
        units = rng.randint(1, 400)
        price = Decimal(rng.randint(200, 90_000)) / 100
        rows.append([rng.choice(_REGIONS), rng.choice(_PRODUCTS), units, f"{units * price:.2f}"])
    return _csv_text(["region", "product", "units", "revenue"], rows)


def _inventory(rng: random.Random) -> str:
    rows: list[list[object]] = []
    for i, product in enumerate(_PRODUCTS, 1):
        for warehouse in ("AMS", "BER", "MAD"):
            rows.append(
                [
                    f"SKU-{i:03d}",
                    product,
                    warehouse,
                    rng.randint(0, 900),
                    f"{Decimal(rng.randint(100, 40_000)) / 100:.2f}",
                ]
            )
    return _csv_text(["sku", "product", "warehouse", "on_hand", "unit_cost"], rows)


def _pdf(label: str, pages: int) -> bytes:
    buf = io.BytesIO()
    canvas = Canvas(buf, pagesize=A4, invariant=True)
    width, height = A4
    for page in range(1, pages + 1):
        canvas.setFont("Helvetica-Bold", 28)
        canvas.drawString(72, height - 110, f"Sample document {label}")
        canvas.setFont("Helvetica", 14)
        canvas.drawString(72, height - 140, f"Page {page} of {pages}")
        canvas.rect(72, 120, width - 144, height - 300)
        canvas.showPage()
    canvas.save()
    return buf.getvalue()


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string for this ASCII


def _demo_manifest() -> str:
    lines = [
        "# The README's main demo: 50 invoices, two reports and three PDF operations.",
        "# Generated by scripts/make_samples.py. Inputs are relative to this folder; outputs to"
        " the",
        "# output root (--out, default ./out, from where the command runs).",
        "",
        "[defaults]",
        'kind = "invoice"',
        "memory_mb = 400",
        "timeout_s = 120",
        "max_attempts = 3",
        "",
    ]
    for n in range(1, INVOICE_COUNT + 1):
        lines += [
            "[[jobs]]",
            f'id = "inv-{n:04d}"',
            f'input = "../sample-inputs/invoices/{n:04d}.json"',
            f'output = "invoices/inv-{n:04d}.pdf"',
            "",
        ]
    lines += [
        "[[jobs]]",
        'id = "report-sales"',
        'kind = "report"',
        'input = "../sample-inputs/reports/sales.csv"',
        'output = "reports/sales.pdf"',
        'params = { title = "Sales by product", sort_by = "revenue", descending = true, '
        'chart = "revenue" }',
        "",
        "[[jobs]]",
        'id = "report-inventory"',
        'kind = "report"',
        'input = "../sample-inputs/reports/inventory.csv"',
        'output = "reports/inventory.pdf"',
        'params = { title = "Inventory on hand", columns = ["sku", "product", "warehouse", '
        '"on_hand"], sort_by = "sku" }',
        "",
        "[[jobs]]",
        'id = "bundle-ab"',
        'kind = "merge"',
        'inputs = ["../sample-inputs/pdf/a.pdf", "../sample-inputs/pdf/b.pdf"]',
        'output = "bundles/a-and-b.pdf"',
        "",
        "[[jobs]]",
        'id = "stamp-a-draft"',
        'kind = "stamp"',
        'input = "../sample-inputs/pdf/a.pdf"',
        'output = "stamped/a-draft.pdf"',
        'params = { text = "DRAFT" }',
        "",
        "[[jobs]]",
        'id = "split-b"',
        'kind = "split"',
        'input = "../sample-inputs/pdf/b.pdf"',
        'output = "split/b"',
        "params = { pages_per_part = 1 }",
    ]
    return "\n".join(lines) + "\n"


def _write(path: Path, data: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)


def main() -> None:
    """Write every sample file and the demo manifest."""
    rng = random.Random(42)
    for n in range(1, INVOICE_COUNT + 1):
        text = json.dumps(_invoice(rng, n), indent=2, ensure_ascii=False) + "\n"
        _write(SAMPLES / "invoices" / f"{n:04d}.json", text)
    _write(SAMPLES / "reports" / "sales.csv", _sales(rng))
    _write(SAMPLES / "reports" / "inventory.csv", _inventory(rng))
    a_pdf = _pdf("A", 2)
    _write(SAMPLES / "pdf" / "a.pdf", a_pdf)
    _write(SAMPLES / "pdf" / "b.pdf", _pdf("B", 3))
    # Cut mid-file: no xref, no trailer, no %%EOF, as a crashed upload would leave it.
    _write(SAMPLES / "pdf" / "broken.pdf", a_pdf[: len(a_pdf) * 3 // 5])
    _write(JOBS / "demo.toml", _demo_manifest())
    print(
        f"wrote samples under {SAMPLES.relative_to(ROOT)}/ and {JOBS.relative_to(ROOT)}/demo.toml"
    )


if __name__ == "__main__":
    main()
