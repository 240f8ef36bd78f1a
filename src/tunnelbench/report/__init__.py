"""Terminal tables, the HTML report, exports."""
