//! Output side of a load run: the HTML report, the terminal summary, the JSON file.
