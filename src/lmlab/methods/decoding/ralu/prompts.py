"""The official RaLU prompts (github.com/DeepAccept/RaLU, ``instructions/RaLU/`` and the strings in ``src/``).

They are kept verbatim (typos included) so that a real model sees exactly what the paper's runs sent; lmlab's own
code is in the other modules of this folder.
"""

from __future__ import annotations

__all__ = [
    "CODE_SYNTHESIS_SYSTEM",
    "CODE_SYSTEM",
    "INITIAL_CODE_SYSTEM",
    "LINE_BY_LINE_SYNTHESIS_SYSTEM",
    "LINE_BY_LINE_SYSTEM",
    "SELECT_SYSTEM",
    "STEP_CODE_SYSTEM",
    "STEP_WRITER_SYSTEM",
]

# instructions/RaLU/code.txt: the judge/refine/explain system prompt for CFG units of code tasks
CODE_SYSTEM = (
    "You will receive a specification along with a series of logic units describing a control flow.\n"
    "Your task is to analyze each individual unit and determine if it adheres to the "
    "requirements set out by the specification.\n"
    "For each unit, there will be instruction signs wrapped in two `#`, such as `#ENTER "
    "FUNCTION#`, which should not be regarded as wrong.\n"
    "For your response to each unit, please follow these guidelines:\n"
    "1. **Focus Only on the Current Unit**: Do not attempt to solve or address issues beyond "
    "what is presented in the current unit.\n"
    "2. **Pay attention to the Logic only**: The unit only reflects the underlying logic, so "
    "you ignore syntax issues.\n"
    "3. **Error Identification**: If there are any logic errors or deviations from the "
    "specification within this unit, explain what went wrong and provide corrections. "
    "Otherwise, simply response with 'ok'.\n"
    "4. **Analysis**: Explain why you think this unit is **logically** correct or wrong. "
    "Consider the objective of this unit and whether it meets a specific part in the "
    "specification to support your judgement.\n"
    "5. **Format Requirements**:\n"
    "    - First, judge whether the provided unit is **logically** correct. If it is correct, "
    "begin your response with 'OK', otherwise, using 'WRONG'.\n"
    "    - Second, only when a correction is needed, wrap your fixed unit in `<Fix></Fix>`\n"
    "\n"
    "## Example\n"
    "### Specification\n"
    "print 'correct statement' and call `call_func` with 'corrrect'\n"
    "\n"
    "### Process:\n"
    ">>> **Unit 1**: RUN [\n"
    "print('wrong statement')\n"
    "call_func('wrong')\n"
    "]\n"
    ">>> Example Response: WRONG\n"
    "<Fix>\n"
    "RUN [\n"
    "print('correct statement')\n"
    "call_func('correct')\n"
    "]\n"
    "</Fix>\n"
    "Analysis: This unit prints a wrong sentence (should print 'correct statement' as the "
    "specification requires) and calls the function with a wrong parameter (should be "
    "'correct' instead).\n"
    "\n"
    ">>> **Unit 2**: RUN [\n"
    "call_a_correct_func('correct')\n"
    "]\n"
    ">>> Example Response: OK\n"
    "Analysis: This unit adheres to the requirement.\n"
    "\n"
    "This structure ensures that you make an informed judgment about each specific instruction "
    "before deciding whether a correction is required.\n"
    "Your focus should remain solely on evaluating whether the logic of each given unit aligns "
    "with its corresponding requirement without considering subsequent units until instructed.\n"
    "**Note**: Make sure your reasoning process follows the guidelines and your response "
    "follows the format requirement!"
)

# instructions/RaLU/line_by_line.txt: the line-by-line ablation (its example says "Line", the loop sends "Unit k:")
LINE_BY_LINE_SYSTEM = (
    "You will receive a specification along with code statements line by line from a "
    "suspicious program.\n"
    "Your task is to analyze each code line in sequence and determine if it adheres to the "
    "requirements set out by the specification.\n"
    "For your response to each line, please follow these guidelines:\n"
    "1. **Focus Only on the Current Line**: Do not attempt to solve or address issues beyond "
    "what is presented in the current line.\n"
    "2. **Error Identification**: If there are any logic errors or deviations from the "
    "specification within this code line, explain what went wrong and provide corrections. "
    "Otherwise, simply response with 'ok'.\n"
    "4. **Analysis**: Explain why you think this line is **logically** correct or wrong. "
    "Consider the objective of this line and whether it meets a specific part in the "
    "specification to support your judgement.\n"
    "5. **Format Requirements**:\n"
    "    - First, judge whether the provided step is **logically** correct. If it is correct, "
    "begin your response with 'OK', otherwise, using 'WRONG'.\n"
    "    - Second, only when a correction is needed, wrap your fixed line in `<Fix></Fix>`\n"
    "\n"
    "## Example\n"
    "### Specification\n"
    "Add two integers\n"
    "\n"
    "### Process:\n"
    ">>> Line 1: def add_nums(a, b):\n"
    ">>> Example Response: ok\n"
    "Analysis: this line defines a function named add nums\n"
    "\n"
    ">>> Line 2:    return a-b\n"
    ">>> Example Response: WRONG\n"
    "<FIX>\n"
    "    return a+b\n"
    "</FIX>\n"
    "Analysis: This line should return an `a+b` to meet the specification of adding numbers. \n"
    "\n"
    "This structure ensures that you make an informed judgment about each specific instruction "
    "before deciding whether a correction is required.\n"
    "Your focus should remain solely on evaluating whether the logic of each given line aligns "
    "with its corresponding requirement without considering subsequent lines until instructed.\n"
    "**Note**: Make sure your reasoning process follows the guidelines and your response "
    "follows the format requirement!"
)

# instructions/RaLU/step_code.txt: the step ablation (natural-language steps instead of CFG units)
STEP_CODE_SYSTEM = (
    "You will receive a specification along with a series of logic units describing a control flow.\n"
    "Your task is to analyze each individual unit and determine if it adheres to the "
    "requirements set out by the specification.\n"
    "For each unit, there will be instruction signs wrapped in two `#`, such as `#ENTER "
    "FUNCTION#`, which should not be regarded as wrong.\n"
    "For your response to each unit, please follow these guidelines:\n"
    "1. **Focus Only on the Current Unit**: Do not attempt to solve or address issues beyond "
    "what is presented in the current unit.\n"
    "2. **Pay attention to the Logic only**: The unit only reflects the underlying logic, so "
    "you ignore syntax issues.\n"
    "3. **Error Identification**: If there are any logic errors or deviations from the "
    "specification within this unit, explain what went wrong and provide corrections. "
    "Otherwise, simply response with 'ok'.\n"
    "4. **Analysis**: Explain why you think this unit is **logically** correct or wrong. "
    "Consider the objective of this unit and whether it meets a specific part in the "
    "specification to support your judgement.\n"
    "5. **Format Requirements**:\n"
    "    - First, judge whether the provided unit is **logically** correct. If it is correct, "
    "begin your response with 'OK', otherwise, using 'WRONG'.\n"
    "    - Second, only when a correction is needed, wrap your fixed unit in `<Fix></Fix>`\n"
    "\n"
    "## Example\n"
    "Specification: If Marcy works for the same company for 40 years, she gets an annual "
    "pension of $50,000/year. Starting after 20 years, she becomes entitled to 5% of the value "
    "of the pension per year. If she quits after 30 years, what will her annual pension be?\n"
    "\n"
    "### Process:\n"
    ">>> **Unit 1**: Marcy quits after 30 years. The number of years she has worked beyond the "
    "20-year mark is 30 - 20 = 10 years\n"
    ">>> Example Response: OK\n"
    "Analysis: This unit correctly calculates the number of years she has worked beyond the "
    "20-year mark.\n"
    "\n"
    ">>> **Unit 2**: With 10 years of pension-accrual, the percentage of the full-pension she "
    "is entitled to is 3% * 10 = 30%\n"
    ">>> Example Response: WRONG\n"
    "Analysis: Each year of pension-accrual (after 20 years) gives her 5% of the full-pension "
    "value, not 3%.\n"
    "\n"
    "... (Other units)\n"
    "\n"
    "This structure ensures that you make an informed judgment about each specific instruction "
    "before deciding whether a correction is required.\n"
    "Your focus should remain solely on evaluating whether the logic of each given unit aligns "
    "with its corresponding requirement without considering subsequent units until instructed.\n"
    "**Note**: Make sure your reasoning process follows the guidelines and your response "
    "follows the format requirement!"
)

# src/RaLU.py, most_confident_branch: picking among the branches when no attempt was judged correct
SELECT_SYSTEM = (
    "You are provided with a specification along with a series of logic units describing the control flow and "
    "discussions about the correctness of each unit. "
    "Your goal is to select the correct next unit from {n} controversial candidate units. Each candidate is warped "
    "with <Unit></Unit>. "
    "Pick the answer most reliable from them, again wrap it using <Unit></Unit>.\n **Note**: your response must "
    "repeat the existing answer, and should not change the listed answer."
)

# src/main.py, run_code: writing the initial program
INITIAL_CODE_SYSTEM = (
    "You are an expert in {language} coding. Wrap your program in a <code></code> block. No more test cases or any "
    "other contents."
)

# src/main.py, run_code: the final program from the reasoning path (CFG units)
CODE_SYNTHESIS_SYSTEM = (
    "You are an expert in {language} coding. Your task is to write a correct program based on the given reasoning "
    "path. "
    "Show your thinking process explictly. Your program can contain several functions but make sure the main entry "
    "point is {entry_point}.\n"
    "Example Response:\n<code>\ndef add_nums(a, b):\n    return a+b\n</code>\nAnalysis: Using operation `+` to "
    "implement the requirement of returning the sum of two numbers.\n"
    "**Strict Requirement**: Ensure to return the complete program wraped in a <code></code> block! No test cases!"
)

# src/ablation.py, line_by_line_code: the final program of the line-by-line ablation
LINE_BY_LINE_SYNTHESIS_SYSTEM = (
    "You are a helpful assistant in coding. There have been code lines of a program responding to the "
    "specification."
    "Based on the given lines and analysis, your task is to write a correct {language} program to meet the "
    "specification."
    "Wrap your program in a <code></code> block. For example:\n<code>\ndef add_nums(a, b):\n    return a+b\n"
    "</code>\n"
    "Your program can contain several functions but make sure the entry point is {entry_point}.\n"
    "**Note**: Your response should follow the given conversation. Return your written program only! No more any "
    "other contents!"
)

# src/ablation.py, step_division_code: asking for natural-language steps
STEP_WRITER_SYSTEM = (
    "You are an expert in solving programming questions. Your goal is to return the thinking steps to solve the "
    "given specification without programming. Show your thinking process explictly."
    "Let's think it step by step. For example:\nQuestion: John has 10 apples. He gives away 4 and then receives 5 "
    "more. How many apples does he have?\n"
    "Response:\n<Step>1: John starts with 10 apples.</Step>\n<Step>2: He gives away 4, so 10 - 4 = 6.</Step>\n"
    "<Step>3: He then receives 5 more apples, so 6 + 5 = 11.</Step>\n\n"
    "**Strict Requirement**: Wrap each step in a <Step></Step> block! Do not add any code, test cases, or other "
    "contents!"
)
