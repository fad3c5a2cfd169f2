"""The report: verdict, layer table and findings (report-v1), the rule catalogue, and the renderers."""
