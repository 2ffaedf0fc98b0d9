"""Media items: where their bytes come from (sources) and how they are decoded."""
